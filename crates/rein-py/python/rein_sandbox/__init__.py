"""rein's WebAssembly sandbox for reward functions and environments.

A reward or environment plugin is a WebAssembly component; here it runs in rein's sandbox: no
files, network, clock or environment variables unless granted, a memory cap, a wall-clock
deadline per call, a stack limit, and every result checked (lengths, finite numbers). A plugin
that hangs, exhausts memory or panics fails its call, in any thread, and never the process.

- :class:`Reward` scores groups of completions (``score(groups)``).
- :mod:`rein_sandbox.trl` makes a TRL reward function, :mod:`rein_sandbox.verl` a verl
  ``compute_score``.
- :mod:`rein_sandbox.gym` runs environment plugins as Gymnasium environments (needs
  ``gymnasium``: ``pip install rein-sandbox[gym]``).
"""

from ._native import INTERFACE_VERSION, PluginError
from .reward import Reward, builtin_plugins, plugin_path

__all__ = ["INTERFACE_VERSION", "PluginError", "Reward", "builtin_plugins", "plugin_path"]
