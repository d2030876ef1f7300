"""Shared assertion for processor errors: a MediaError whose message names the record and the cause."""

import pytest

from mmrl.processors.errors import MediaError


def expect_media_error(load, src, record_id: str, *words: str, **kw) -> str:
    with pytest.raises(MediaError) as info:
        load(src, record_id=record_id, **kw)
    msg = str(info.value)
    assert msg.startswith(f"sample '{record_id}': "), msg
    for w in words:
        assert w in msg, (w, msg)
    return msg
