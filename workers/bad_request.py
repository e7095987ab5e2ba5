"""The one error of request validation in the workers: a field is invalid, and the message names
it. PartitionService turns it into a code -1 reply."""
from __future__ import annotations


class BadRequest(Exception):
    """A request field is invalid; the message names the field."""
