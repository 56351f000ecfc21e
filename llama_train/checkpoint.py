"""Checkpoints: ``OUT/checkpoints/step_XXXXXXXX/``, written to a temporary directory, its files
fsynced, renamed, then ``OUT/checkpoints/latest`` is replaced atomically (and the directory
fsynced); the last ``keep`` stay. A process killed at any point leaves ``latest`` naming a whole
checkpoint (tested by killing one before the rename); what it leaves behind (``.tmp_*``) is
removed by the next save.

* format 'full': model.safetensors and optimizer.safetensors, full (unsharded) state dicts
  gathered on rank 0;
* format 'sharded': torch.distributed.checkpoint files, every rank writing its own shards in
  parallel (what an 8B model needs: 96 GB of fp32 weights and AdamW state);

both with state.json holding the step, tokens, skipped steps, the data position and the RNG
state. Optimizer state is keyed by parameter names, so both formats load at another world size
(DCP reshards).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from .distributed import Dist
from .metrics import crash, crash_requested

_SEP = "::"  # optimizer.safetensors keys: parameter name, _SEP, state name


def _full_state(model, opt):
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    o = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=o), get_optimizer_state_dict(model, opt, options=o)


def _sharded_state(model, opt):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}


def save_checkpoint(out: Path, step: int, model, opt, stream, tokens: int, skipped: int,
                    keep: int, dist: Dist, fmt: str = "full", keep_steps=()):
    """Checkpoint after ``step`` (collective: every rank calls it). The last ``keep``
    checkpoints stay, and those after the steps in ``keep_steps``."""
    root = out / "checkpoints"
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}"
    if dist.main:
        root.mkdir(parents=True, exist_ok=True)
        # left by a killed run: temporary files, and checkpoints after this step (written
        # after the one this run resumed from, never pointed to by latest)
        later = [p for p in root.glob("step_*") if p.is_dir() and int(p.name[5:]) > step]
        for stale in [*root.glob(".tmp_step_*"), *root.glob(".latest_*"), *root.glob(".old_*"),
                      *later]:
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        tmp.mkdir()
    dist.barrier()
    state = {"step": step, "tokens": tokens, "skipped": skipped, "data": stream.state(),
             "rng": {"torch": torch.get_rng_state().tolist()}, "world": dist.world,
             "format": fmt}
    if fmt == "sharded":
        import torch.distributed.checkpoint as dcp
        dcp.save(_sharded_state(model, opt), checkpoint_id=str(tmp))  # collective
    else:
        from safetensors.torch import save_file
        msd, osd = _full_state(model, opt)  # collective: every rank takes part
        if dist.main:
            save_file({k: v.detach().cpu().contiguous() for k, v in msd.items()},
                      str(tmp / "model.safetensors"))
            tensors, meta = {}, {"param_groups": osd["param_groups"], "state": {}}
            for name, st in osd["state"].items():
                meta["state"][name] = {}
                for k, v in st.items():
                    if torch.is_tensor(v):
                        tensors[f"{name}{_SEP}{k}"] = v.detach().cpu().contiguous()
                    else:
                        meta["state"][name][k] = v
            save_file(tensors, str(tmp / "optimizer.safetensors"))
            state["optimizer"] = meta
    dist.barrier()
    if dist.main:
        (tmp / "state.json").write_text(json.dumps(state))
        for f in [f for f in tmp.rglob("*") if f.is_file()]:  # on disk before the rename
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if crash_requested("checkpoint-before-rename", step):
            crash()
        if final.exists():  # not latest (a run killed after the rename, before the pointer)
            os.rename(final, root / f".old_{final.name}")
            shutil.rmtree(root / f".old_{final.name}")
        os.rename(tmp, final)
        latest_tmp = root / f".latest_{os.getpid()}"
        with open(latest_tmp, "w") as fh:
            fh.write(final.name)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(latest_tmp, root / "latest")
        _fsync_dir(root)  # the renames on disk
        kept = {f"step_{s:08d}" for s in keep_steps}
        done = sorted(p for p in root.glob("step_*") if p.is_dir() and p.name not in kept)
        for old in done[:-keep]:  # renamed first: no half-deleted step_* is ever listed
            os.rename(old, root / f".old_{old.name}")
            shutil.rmtree(root / f".old_{old.name}")
    dist.barrier()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def saved_steps(out: Path) -> list[int]:
    """The steps of the checkpoints in OUT/checkpoints, ascending."""
    return sorted(int(p.name[5:]) for p in (Path(out) / "checkpoints").glob("step_*")
                  if p.is_dir() and (p / "state.json").is_file())


def load_checkpoint(out: Path, model, opt, dist: Dist, step: int | None = None):
    """Load OUT/checkpoints/latest (or the checkpoint after ``step``) into ``model`` and ``opt``
    and restore the RNG; returns its state.json, or None when there is no checkpoint."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    latest = out / "checkpoints" / "latest"
    if step is not None:
        path = out / "checkpoints" / f"step_{step:08d}"
        if not (path / "state.json").is_file():
            raise FileNotFoundError(f"no checkpoint after step {step} in {out}/checkpoints "
                                    f"(there: {saved_steps(out)})")
    elif not latest.is_file():
        return None
    else:
        path = out / "checkpoints" / latest.read_text().strip()
    state = json.loads((path / "state.json").read_text())
    if state.get("format", "full") == "sharded":
        import torch.distributed.checkpoint as dcp
        sd = _sharded_state(model, opt)  # the templates: this run's shards
        dcp.load(sd, checkpoint_id=str(path))
        msd, osd, o = sd["model"], sd["optim"], None
    else:
        msd = load_file(str(path / "model.safetensors"))
        osd = {"param_groups": state["optimizer"]["param_groups"],
               "state": {n: dict(st) for n, st in state["optimizer"]["state"].items()}}
        for key, v in load_file(str(path / "optimizer.safetensors")).items():
            name, k = key.rsplit(_SEP, 1)
            osd["state"].setdefault(name, {})[k] = v
        o = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, msd, options=o)
    set_optimizer_state_dict(model, opt, osd, options=o)
    torch.set_rng_state(torch.tensor(state["rng"]["torch"], dtype=torch.uint8))
    return state
