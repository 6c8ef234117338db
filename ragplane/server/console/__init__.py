"""The operator's console: pages under /console on the HTTP port (`app.Console`)."""

from ragplane.server.console.app import Console, ConsoleRuntime

__all__ = ["Console", "ConsoleRuntime"]
