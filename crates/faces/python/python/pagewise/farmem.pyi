from os import PathLike
from typing import Any, Optional, Sequence, Union

__all__ = ["run", "Result"]

class Result(dict[str, Any]):
    @property
    def status(self) -> int: ...

def run(
    cmd: Sequence[Union[str, PathLike[str]]],
    *,
    local_pages: int,
    latency_ns: int = ...,
    bandwidth_bps: int = ...,
    policy: str = ...,
    fault_path: str = ...,
    trace: Optional[Union[str, PathLike[str]]] = ...,
) -> Result: ...
