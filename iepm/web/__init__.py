"""Web reports, REST API and Prometheus metrics: ``create_app`` and ``iepm serve``."""
