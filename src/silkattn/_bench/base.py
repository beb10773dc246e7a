"""What a benchmark case is made of: the Op that specifies one op's cases and contenders, and the
Call each contender's builder returns (see cases.py). Loaded, as the whole package, by worker
processes in Pythons where silkattn may be absent: nothing here imports it."""
import dataclasses
from typing import Callable, NamedTuple, Optional

import numpy as np

GFLOP = 1e9


class Call(NamedTuple):
    run: Callable
    result: Callable = np.asarray


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    cases: Callable                 # full (bool) -> [case]: the quick set, or every case
    label: Callable                 # case -> the name printed (and matched by --match)
    inputs: Callable                # case -> inputs, built once per case in each worker
    silkattn: Callable              # (case, inputs, silkattn module) -> Call
    rivals: dict                    # rival name -> (case, inputs) -> Call
    gflop: Optional[Callable] = None  # case -> GFLOP per call, for the GFLOP/s column


def _rng(seed=0):
    return np.random.default_rng(seed)


def _torch():
    import torch
    return torch


def _inference(torch, fn):
    def run():
        with torch.inference_mode():
            return fn()
    return run
