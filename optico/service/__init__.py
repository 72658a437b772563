"""The service: the REST API (FastAPI), the job workers, and later the dashboard and the scheduler.

Nothing below optico.service is imported by the engine (pool, agents, launchers, perfmodel): the
service is a layer on top of them.
"""
