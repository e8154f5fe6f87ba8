"""Errors the router answers itself, in the OpenAI/vLLM JSON shape."""
from __future__ import annotations

_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "MethodNotAllowed",
          408: "RequestTimeout", 413: "RequestTooLarge",
          431: "RequestHeaderFieldsTooLarge", 500: "InternalServerError", 501: "NotImplemented",
          502: "BadGateway", 503: "ServiceUnavailable", 504: "GatewayTimeout"}


class RouterError(Exception):
    """A request the router refuses; carries the HTTP status, the offending field and the metric's reason.

    ``reason`` labels ``rolloutrouter_request_errors_total`` (default ``http_<status>``).
    """

    def __init__(self, status: int, message: str, param: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.reason = reason or f"http_{status}"


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "Error"), "param": param, "code": status}}
