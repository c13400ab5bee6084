"""tokenergy: RL for small transformer and language-model agents, with token-level energy.

The math lives in small pure modules (``advantages``, ``losses``, ``energy``); ``algos``
holds the training loops, ``envs`` the environments, ``runs`` the run folders and
``reports`` the pictures and tables made from them.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
