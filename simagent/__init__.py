"""simagent: a chat assistant that runs simulations in a persistent Python kernel."""

__version__ = "0.1.0"
