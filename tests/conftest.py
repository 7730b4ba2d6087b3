pytest_plugins = ["testbed.pytest_plugin"]
