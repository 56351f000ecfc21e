"""Conformance suite: checks a backend bit for bit against ocpmx.emulator (see its issue)."""
