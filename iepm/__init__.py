"""iepm: end-to-end network and application performance monitoring between research sites."""

__version__ = "0.1.0"
