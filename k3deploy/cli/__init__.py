"""The application layer's command line: `k3deploy` (app.py), what it prints, its Prefect server, reruns."""
