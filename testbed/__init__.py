"""The k3deploy test bed: N fake cluster nodes on this machine, for tests.

`python -m testbed up [--hosts N] [--state-dir DIR]` makes, per host, a network
namespace on bridge k3tb0 (10.213.0.10+i), a real sshd with its own hostname
and private /srv, /etc (overlay), /etc/hccn.conf and NPU tool simulators, and a
Podman Docker-API engine; plus one registry at 10.213.0.1:5000 holding a small
test image. `python -m testbed down` removes all of it. The state file
(default /run/k3deploy-testbed/testbed.json, or $K3DEPLOY_TESTBED_STATE) says
where everything is; `testbed.pytest_plugin` offers it as fixtures.

Importing this package has no side effects and pulls in no heavy modules.
"""

from .layout import STATE_ENV, BedState, HostState, load_state, resolve_state_file

__all__ = ["STATE_ENV", "BedState", "HostState", "load_state", "resolve_state_file"]
