"""Which torch device a model runs on: the one place a user's ``device`` argument is read."""
from __future__ import annotations

import torch

from gru4rec.errors import Gru4RecError

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``'auto'`` picks CUDA when it is available, else the CPU; ``'cpu'``, ``'cuda'``,
    ``'cuda:N'`` (or a :class:`torch.device`) are checked: an unknown name, or CUDA on a machine
    without it, is a :class:`~gru4rec.errors.Gru4RecError` naming the value."""
    if isinstance(device, torch.device):
        resolved = device
    elif device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            resolved = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise Gru4RecError(f"device: unknown device {device!r} (use cpu, cuda, cuda:N or auto)") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise Gru4RecError(f"device: {str(device)!r} was asked for but CUDA is not available (use --device cpu)")
    if resolved.type not in ("cpu", "cuda"):
        raise Gru4RecError(f"device: {str(device)!r} is not supported (use cpu, cuda, cuda:N or auto)")
    return resolved
