"""`python -m k3deploy.localhub --root DIR [--host 127.0.0.1] [--port 0]`: serve DIR until interrupted."""

from k3deploy.localhub.server import main

main()
