"""The error of every failed call to the Trainyard API.

It has a module of its own, importing nothing of the SDK's, so that both
:mod:`trainyard.client` (which raises it) and :mod:`trainyard.fit` (which
catches it) depend on it one way and not on each other.
"""

from typing import Any, Dict, List

import requests


class ApiError(Exception):
    """An error answer of the API (any HTTP status of 400 or more).

    ``status`` is the HTTP status, ``title`` and ``detail`` the problem
    document's (RFC 9457) summary and explanation, ``errors`` its list of
    ``{"field", "message"}`` violations (empty when the problem is not about
    fields), ``body`` the whole decoded document (or the raw text when the
    answer was not JSON).
    """

    def __init__(self, status: int, title: str, detail: str, errors: List[Dict[str, str]], body: Any, method: str = "", url: str = ""):
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = errors
        self.body = body
        self.method = method
        self.url = url
        fields = "; ".join(f"{e.get('field')}: {e.get('message')}" for e in errors)
        super().__init__(f"{method} {url}: {status} {title}: {detail}" + (f" ({fields})" if fields else ""))

    @property
    def fields(self) -> List[str]:
        """The names of the offending fields (``errors[].field``)."""
        return [e.get("field", "") for e in self.errors]

    @classmethod
    def from_response(cls, r: requests.Response) -> "ApiError":
        """The error a non-success response stands for."""
        body: Any
        try:
            body = r.json()
        except ValueError:
            body = r.text
        if isinstance(body, dict):
            errors = body.get("errors") or []
            return cls(
                int(body.get("status") or r.status_code),
                str(body.get("title") or r.reason or ""),
                str(body.get("detail") or ""),
                [e for e in errors if isinstance(e, dict)],
                body,
                r.request.method or "",
                r.url,
            )
        return cls(r.status_code, r.reason or "", str(body)[:2000], [], body, r.request.method or "", r.url)
