"""The dashboard: server-rendered pages over the pool (see views.py), served by `optico serve` at `/`."""

from optico.service.dashboard.views import router

__all__ = ["router"]
