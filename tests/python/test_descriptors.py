"""The coda_tensor descriptors the ctypes layer hands to the C ABI (python/coda/_C.py): every field as the C side
reads it, for ranks 0-4, strided and empty tensors, every dtype; the block structs filled in field order; bad
dtype/rank errors. CPU only (descriptors are host memory)."""
import ctypes

import pytest
import torch

from coda import _C


def _fields(d):
    return (d.data, d.dtype, d.rank, list(d.sizes), list(d.strides), d.device)


def _expected(t):
    n = t.dim()
    pad = [0] * (_C.MAX_RANK - n)
    return (t.data_ptr() if t.numel() else None, _C.DTYPE[t.dtype], n, list(t.shape) + pad, list(t.stride()) + pad,
            t.get_device())


@pytest.mark.parametrize("make", [
    lambda: torch.tensor(3.0),
    lambda: torch.zeros(7, dtype=torch.int32),
    lambda: torch.zeros(5, 9, dtype=torch.bfloat16)[:, 1:8:2],
    lambda: torch.zeros(2, 3, 4, dtype=torch.float16).transpose(0, 2),
    lambda: torch.zeros(2, 3, 4, 5, dtype=torch.int64),
    lambda: torch.zeros(0, 16, dtype=torch.bfloat16),
])
def test_desc_fields(make):
    t = make()
    assert _fields(_C.desc(t)._obj) == _expected(t)
    assert _C.desc(None) is None


def test_block_struct_fields_in_order():
    ts = [torch.zeros(i + 1, 2 * i + 3, dtype=torch.bfloat16) for i in range(6)]
    saved = _C.tensors(_C.BlockSaved, *ts, None)  # the version-2 field z unset
    assert ctypes.sizeof(saved) == 8 + 7 * ctypes.sizeof(_C.Tensor)  # block.h: struct_size, then seven tensors
    assert saved.struct_size == ctypes.sizeof(_C.BlockSaved)
    for (name, _), t in zip(_C.BlockSaved._fields_[1:], ts):
        assert _fields(getattr(saved, name)) == _expected(t), name
    assert bytes(saved.z) == bytes(ctypes.sizeof(_C.Tensor))  # unset: all zero (data NULL, rank 0)
    with pytest.raises(TypeError, match="BlockSaved takes 7 tensors, got 6"):
        _C.tensors(_C.BlockSaved, *ts)


def test_block_structs_carry_their_size():
    """block.h "Versioning": every block struct the Python layer builds opens with its own size (the C ABI refuses
    any size it does not know); version 2's sizes, as tests/cpu/test_api_block.cpp checks them on the C side."""
    assert _C.BlockConfig().struct_size == ctypes.sizeof(_C.BlockConfig) == 48  # 40 in version 1, + qk_eps, padded
    assert _C.BlockConfig.qk_eps.offset == 40
    for cls, n in ((_C.BlockWeights, 8), (_C.BlockGrads, 8), (_C.BlockSaved, 7)):
        assert cls().struct_size == ctypes.sizeof(cls) == 8 + n * ctypes.sizeof(_C.Tensor), cls.__name__
    assert _C.BlockConfig(hidden_size=64, eps=1e-5).hidden_size == 64
    with pytest.raises(TypeError):
        _C.BlockConfig(64)  # positionally the first field would be struct_size


def test_desc_rejects_dtype_and_rank():
    with pytest.raises(TypeError, match="dtype torch.float64"):
        _C.desc(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="rank 5"):
        _C.desc(torch.zeros(1, 1, 1, 1, 1))
