"""Llama 3.1 pretraining on the native backend (see its issue)."""
