"""The one encode loop, pooling and the Encoder base, against direct computations."""

from __future__ import annotations

import numpy as np
import pytest

from embedding_core.serving.inference import (
    Encoder,
    bucket_width,
    check_texts,
    encode_in_batches,
    l2_normalize,
    masked_mean,
    round_up,
    token_slot_counts,
)


def test_masked_mean_matches_a_hand_computation():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    mask = np.array([[1, 1, 0], [0, 0, 0]])
    out = np.asarray(masked_mean(x, mask))
    np.testing.assert_allclose(out[0], (x[0, 0] + x[0, 1]) / 2)
    np.testing.assert_array_equal(out[1], np.zeros(4))  # nothing real: zeros, not NaN


@pytest.mark.parametrize("batch_size,pad_multiple", [(1, 1), (3, 4), (8, 8), (100, 16)])
def test_encode_loop_returns_input_order_and_is_chunking_invariant(batch_size, pad_multiple):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, size=23)
    values = rng.normal(size=(23, 48)).astype(np.float32)
    widths, shapes = [], []

    def build(rows, width):
        widths.append(width)
        assert width >= lengths[rows].max() and width % pad_multiple == 0
        assert width == bucket_width(lengths[rows].max(), multiple=pad_multiple)
        block = np.zeros((batch_size, width), np.float32)
        block[: len(rows)] = values[rows, :width]
        return block, np.pad(lengths[rows], (0, batch_size - len(rows)))

    def forward(inputs):
        block, lens = inputs
        shapes.append(block.shape)
        keep = np.arange(block.shape[1])[None, :] < lens[:, None]
        return np.stack([(block * keep).sum(1), lens.astype(np.float32)], axis=1)

    out = encode_in_batches(lengths, build, forward, batch_size=batch_size,
                            pad_multiple=pad_multiple)
    want = np.stack([[values[i, :lengths[i]].sum(), lengths[i]] for i in range(23)])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert all(s[0] == batch_size for s in shapes)  # fixed batch: one compile per width
    assert widths == sorted(widths, reverse=True)  # longest first


def test_bucket_width_by_hand():
    # exact below 16; then 8 widths per doubling: steps of 2 in [16, 32), 4 in [32, 64), ...
    assert [bucket_width(n) for n in (0, 1, 13, 15, 16, 17, 31, 32, 33, 63, 64, 65, 129)] == [
        1, 1, 13, 15, 16, 18, 32, 32, 36, 64, 64, 72, 144]
    assert [bucket_width(n, per_octave=1, multiple=8) for n in (1, 9, 17, 100)] == [
        8, 16, 32, 128]  # one width per doubling, at least a multiple of 8
    assert [bucket_width(n, multiple=8) for n in (3, 17, 65, 129)] == [8, 24, 72, 144]
    widths = {bucket_width(n) for n in range(1, 513)}
    assert len(widths) == 15 + 8 * 5 + 1  # 1..15, 8 per octave 16..511, and 512
    assert all(bucket_width(n) - n < max(n / 8, 1) for n in range(1, 513))
    with pytest.raises(ValueError, match="per_octave"):
        bucket_width(5, per_octave=0)


def test_token_slot_counts_by_hand():
    lengths = np.array([3, 17, 5, 9, 40, 33])  # sorted: 40 33 | 17 9 | 5 3 -> widths 40, 18, 5
    before = token_slot_counts()
    encode_in_batches(lengths, lambda rows, width: (rows, width),
                      lambda inputs: np.zeros((2, 1)), batch_size=2)
    slots, real = (a - b for a, b in zip(token_slot_counts(), before, strict=True))
    assert (slots, real) == (2 * (40 + 18 + 5), 107)


def test_round_up_and_normalize():
    assert [round_up(n, 8) for n in (1, 8, 9)] == [8, 8, 16]
    v = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))
    np.testing.assert_allclose(v, [[0.6, 0.8], [0.0, 0.0]])


class _Lengths(Encoder):
    """A toy encoder: [len(text), 1.0]."""

    dim = 2

    def _encode(self, texts, *, batch_size, show_progress_bar, scale=1.0):
        return np.array([[len(t) * scale, 1.0] for t in texts])


def test_encoder_base_checks_normalises_and_passes_the_view():
    enc = _Lengths()
    out = enc.encode(["abc", "a"], scale=2.0)
    assert out.dtype == np.float32 and out.shape == (2, 2)
    np.testing.assert_allclose(out, [[6, 1], [2, 1]])
    unit = enc.encode(["abc"], normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-6)
    assert enc.encode([]).shape == (0, 2)
    np.testing.assert_allclose(enc.encode("abc"), [3, 1])  # one string: one row, [dim]
    with pytest.raises(TypeError, match="text 1 is a int"):
        enc.encode(["ok", 3])
    with pytest.raises(ValueError, match="text 1 is empty"):
        enc.encode(["ok", "  \t"])
    with pytest.raises(ValueError, match="batch_size"):
        enc.encode(["ok"], batch_size=-1)
    with pytest.raises(TypeError, match="normalize must be True or False"):
        enc.encode(["ok"], normalize="no")
    with pytest.raises(TypeError, match="text 0 is a int"):
        check_texts([3])


def test_batch_size_is_checked_and_never_pads_past_the_texts():
    seen = []

    class _Spy(_Lengths):
        def _encode(self, texts, *, batch_size, show_progress_bar):
            seen.append(batch_size)
            return super()._encode(texts, batch_size=batch_size,
                                   show_progress_bar=show_progress_bar)

    enc = _Spy()
    enc.encode(["a", "b"], batch_size=10**9)
    assert seen == [2]
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="batch_size"):
            enc.encode(["a"], batch_size=bad)


def test_text_line_files_drop_a_bom_and_refuse_a_bare_carriage_return(tmp_path):
    from data_pipelines.errors import DataError
    from embedding_core.storage.text_lines import read_text_lines

    path = tmp_path / "in.txt"
    path.write_bytes("\ufeffone\r\ntwo\n".encode())
    assert read_text_lines(path, "query") == ["one", "two"]
    path.write_bytes(b"ok\na\rb\n")
    with pytest.raises(DataError, match=r"in.txt:2: field 'query': a carriage return"):
        read_text_lines(path, "query")
