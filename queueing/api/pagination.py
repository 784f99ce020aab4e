from __future__ import annotations

from rest_framework.pagination import CursorPagination


class JobCursorPagination(CursorPagination):
    """Stable pages for polling clients however fast jobs arrive: newest first by id."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
