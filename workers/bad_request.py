"""The errors of request validation in the workers: a field is invalid, and the message names
it, or the request is refused on the queues' state. PartitionService turns either into a code -1
reply."""
from __future__ import annotations


class BadRequest(Exception):
    """A request field is invalid; the message names the field."""


class Refused(BadRequest):
    """A valid request refused on the state of the queues (full, too many queues, a producer's
    sequence already used). That state may rest on records not yet committed, so the refusal
    waits for them like a write's reply (PartitionService.direct)."""
