from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination


class JobCursorPagination(CursorPagination):
    """Stable pages for polling clients however fast jobs arrive: newest first by id."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Any) -> int:
        """`page_size` as asked, at most `max_page_size`; one that is not a whole number
        of at least 1 is a 400 on the parameter (DRF's own would quietly use the
        default, and a client would never learn its parameter was ignored)."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None or raw == "":
            return self.page_size
        value = int(raw) if raw.isascii() and raw.isdigit() else 0
        if value < 1:
            raise ValidationError({self.page_size_query_param: [
                f"A whole number from 1 to {self.max_page_size} (larger ones are cut to "
                f"{self.max_page_size})."]})
        return min(value, self.max_page_size)
