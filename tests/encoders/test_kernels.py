"""The attention kernels: which run where, how each is called and told to mask, and which
one a model takes (the check against the reference, timed, recorded, or asked for)."""

import time

import numpy as np
import pytest
import torch
from test_flat_decoder import _tiny_decoder

from bulkembed.config import Attention, RunConfig
from bulkembed.encoders import kernel_choice, kernels, varlen
from bulkembed.encoders.backend import choose_attention
from bulkembed.encoders.flat import flat_family, flat_module
from bulkembed.encoders.kernel_choice import AttentionShape, choose_kernel
from bulkembed.encoders.kernels import FULL
from bulkembed.encoders.varlen import Sequences, reference_attention
from bulkembed.errors import UsageError
from bulkembed.models.model_spec import resolve_model

CUDA = torch.cuda.is_available()


def _kernel_attention(query, key, value, sequences, causal=False, window=FULL, name=None):
    """Kernel `name`'s attention (PyTorch's varlen kernel unless told) over `sequences`."""
    cu, longest = sequences.cu_seqlens, sequences.longest
    return kernels.call(name or kernels.VARLEN_ATTN, query, key, value, cu, longest, causal, window)


def _by_reference(query, key, value, cu_q, cu_k, max_q, max_k, window_size=(-1, -1)):
    """Stands for a flash kernel: the reference over the documents of `cu_q`."""
    lengths = np.diff(cu_q.numpy())
    causal = window_size[1] == 0
    return reference_attention(query, key, value, Sequences.on_host(lengths), causal, window_size)


def test_the_kernel_gets_the_tokens_end_to_end_and_cu_seqlens(monkeypatch):
    calls = []

    def stand_in(query, key, value, cu_q, cu_k, max_q, max_k, window_size=(-1, -1)):
        calls.append((query.shape, cu_q.dtype, cu_q.tolist(), cu_k is cu_q, max_q, max_k))
        return _by_reference(query, key, value, cu_q, cu_k, max_q, max_k)

    monkeypatch.setattr(kernels, "_torch_varlen", lambda: stand_in)
    torch.manual_seed(0)
    query, key, value = torch.randn(3, 9, 2, 4).unbind(0)
    found = _kernel_attention(query, key, value, Sequences.on_host(np.array([5, 1, 3])))
    assert calls == [((9, 2, 4), torch.int32, [0, 5, 6, 9], True, 5, 5)]
    # Each document's attention alone, computed by PyTorch on [1, heads, length, size].
    for start, end in ((0, 5), (5, 6), (6, 9)):
        q, k, v = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        alone = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        torch.testing.assert_close(found[start:end], alone[0].transpose(0, 1))


def test_a_kernel_that_returns_the_log_sum_exp_too_gives_the_output(monkeypatch):
    def stand_in(query, key, value, cu_q, cu_k, max_q, max_k, window_size=(-1, -1)):
        output = _by_reference(query, key, value, cu_q, cu_k, max_q, max_k)
        return output, torch.zeros(query.shape[1], query.shape[0])

    monkeypatch.setattr(kernels, "_flash_attention_3", lambda: stand_in)
    query, key, value = torch.randn(3, 5, 2, 4).unbind(0)
    sequences = Sequences.on_host(np.array([3, 2]))
    expected = reference_attention(query, key, value, sequences)
    found = _kernel_attention(query, key, value, sequences, name=kernels.FLASH_ATTENTION_3)
    torch.testing.assert_close(found, expected)


def test_the_jagged_layout_equals_the_reference_and_masks_nothing_else():
    torch.manual_seed(0)
    lengths = np.array([7, 3, 3, 1])
    query = torch.randn(14, 4, 8)
    key, value = torch.randn(2, 14, 2, 8).unbind(0)
    sequences = Sequences.on_host(lengths)
    from torch.nn.attention import SDPBackend

    found = kernels._jagged(query, key, value, sequences.cu_seqlens, 7, SDPBackend.MATH)
    torch.testing.assert_close(found, reference_attention(query, key, value, sequences))
    for causal, window in ((True, FULL), (False, (2, 2))):
        arguments = (query, key, value, sequences.cu_seqlens, 7, causal, window)
        assert kernels.call(kernels.CUDNN_JAGGED, *arguments) is None


def _attention_by_hand(query, key, value, lengths, causal, window):
    """Each document's attention from its score matrix, one query at a time: softmax over
    the keys the query may see, grouped heads expanded."""
    heads, size = query.shape[1], query.shape[2]
    groups = heads // key.shape[1]
    output, start = [], 0
    for length in lengths:
        for i in range(length):
            row = []
            for head in range(heads):
                keys = [
                    j
                    for j in range(length)
                    if (window[0] < 0 or j >= i - window[0])
                    and (window[1] < 0 or j <= i + window[1])
                    and (not causal or j <= i)
                ]
                q = query[start + i, head]
                k = key[[start + j for j in keys], head // groups]
                v = value[[start + j for j in keys], head // groups]
                weights = torch.softmax(k @ q / size**0.5, dim=0)
                row.append(weights @ v)
            output.append(torch.stack(row))
        start += length
    return torch.stack(output)


@pytest.mark.parametrize(
    ("causal", "window", "key_heads"),
    [(False, (2, 2), 4), (False, (3, 1), 2), (True, (-1, -1), 1), (True, (2, -1), 2)],
)
def test_windowed_and_grouped_attention_equals_attention_by_hand(
    monkeypatch, causal, window, key_heads
):
    torch.manual_seed(0)
    lengths = np.array([7, 7, 4, 1, 9])
    tokens = int(lengths.sum())
    query = torch.randn(tokens, 4, 8, dtype=torch.float64)
    key, value = torch.randn(2, tokens, key_heads, 8, dtype=torch.float64).unbind(0)
    expected = _attention_by_hand(query, key, value, lengths, causal, window)
    sequences = Sequences.on_host(lengths)
    found = varlen.varlen_attention(query, key, value, sequences, causal, window)
    torch.testing.assert_close(found, expected)
    # A kernel that takes a window and groups (PyTorch 2.10 on) is told both.
    told = []

    def stand_in(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), enable_gqa=False):
        told.append((window_size, enable_gqa))
        return _by_reference(q, k, v, cu_q, cu_k, max_q, max_k, window_size)

    monkeypatch.setattr(kernels, "_torch_varlen", lambda: stand_in)
    found = _kernel_attention(query, key, value, sequences, causal, window)
    torch.testing.assert_close(found, expected)
    assert told == [((window[0], 0 if causal else window[1]), key_heads != 4)]


def test_varlen_attention_calls_the_kernel_its_sequences_name(monkeypatch):
    called = []

    def stand_in(query, key, value, cu_q, cu_k, max_q, max_k, *, is_causal=False):
        """A kernel that masks causally and by no window (PyTorch 2.9's)."""
        called.append(max_q)
        lengths = Sequences.on_host(np.diff(cu_q.numpy()))
        return reference_attention(query, key, value, lengths, is_causal)

    monkeypatch.setattr(kernels, "_torch_varlen", lambda: stand_in)
    query, key, value = torch.randn(3, 6, 2, 4).unbind(0)
    # On a CPU no kernel runs: `auto` is the reference there.
    expected = varlen.varlen_attention(query, key, value, Sequences.on_host(np.array([4, 2])))
    assert called == []
    named = Sequences.on_host(np.array([4, 2]), kernels.VARLEN_ATTN)
    torch.testing.assert_close(varlen.varlen_attention(query, key, value, named), expected)
    assert called == [4]
    # A kernel that cannot mask as asked leaves the call to the reference.
    windowed = varlen.varlen_attention(query, key, value, named, False, (1, 1))
    assert called == [4]
    expected = reference_attention(query, key, value, named, False, (1, 1))
    torch.testing.assert_close(windowed, expected)
    assert not torch.allclose(windowed, varlen.varlen_attention(query, key, value, named))
    refused = Sequences.on_host(np.array([4, 2]), kernels.CUDNN_JAGGED)
    found = varlen.varlen_attention(query, key, value, refused, True)
    torch.testing.assert_close(found, reference_attention(query, key, value, refused, True))


def test_each_kernel_is_told_to_mask_in_its_own_words():
    def flash_attn(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, window_size=(-1, -1)): ...
    def torch_2_9(q, k, v, cu_q, cu_k, max_q, max_k, *, is_causal=False): ...
    def torch_2_10(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1)): ...

    told = kernels.mask_arguments
    assert told(flash_attn, True) == {"causal": True}
    assert told(torch_2_9, True) == {"is_causal": True}
    assert told(torch_2_10, True) == {"window_size": (-1, 0)}
    assert told(torch_2_10, False) == told(torch_2_9, False) == {}
    assert told(flash_attn, False, (64, 64)) == {"window_size": (64, 64)}
    assert told(flash_attn, True, (8, -1)) == {"causal": True, "window_size": (8, 0)}
    assert told(torch_2_10, True, (8, -1)) == {"window_size": (8, 0)}
    assert told(torch_2_9, False, (64, 64)) is None


def _torch_varlen(*arguments):
    """Stands for PyTorch's varlen kernel in tests that only choose it."""


def _flash_attn_varlen(*arguments):
    """Stands for flash-attn's varlen kernel in tests that only choose it."""


def _flash_attention_3_varlen(*arguments):
    """Stands for flash-attention 3's varlen kernel in tests that only choose it."""


def _a_gpu(monkeypatch, capability, kernel="torch", flash_built=True, fa3=False, cudnn=False):
    """This machine as one with a CUDA device of `capability`, and the varlen kernel of
    PyTorch (in a build with flash attention or not), of flash-attn, or none; flash-attention
    3's where `fa3`, cuDNN where `cudnn`."""
    monkeypatch.setattr(
        kernels, "_torch_varlen", lambda: _torch_varlen if kernel == "torch" else None
    )
    flash_attn = _flash_attn_varlen if kernel == "flash-attn" else None
    monkeypatch.setattr(kernels, "_flash_attn_2", lambda: flash_attn)
    monkeypatch.setattr(
        kernels, "_flash_attention_3", lambda: _flash_attention_3_varlen if fa3 else None
    )
    monkeypatch.setattr(kernels, "_jagged_available", lambda: cudnn)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: flash_built)


def _spec(folder, **options):
    return resolve_model(RunConfig(inputs=("x",), output="out", model=str(folder), **options))


def test_auto_is_flat_where_a_flash_kernel_runs_and_padded_elsewhere(tiny_st, monkeypatch):
    spec = _spec(tiny_st("cls"))
    assert choose_attention(spec, "cpu", torch.float32) == (Attention.PADDED, None)
    assert choose_attention(spec, "cpu", torch.bfloat16) == (Attention.PADDED, None)
    flat = _spec(tiny_st("cls"), attention="flat")
    assert choose_attention(flat, "cpu", torch.float32) == (Attention.FLAT, None)
    _a_gpu(monkeypatch, (9, 0))
    assert choose_attention(spec, "cuda:1", torch.bfloat16) == (Attention.FLAT, None)
    assert choose_attention(spec, "cuda:0", torch.float16) == (Attention.FLAT, None)
    # CUDA in float32: no flash kernel computes it, and nothing to say.
    assert choose_attention(spec, "cuda:0", torch.float32) == (Attention.PADDED, None)
    forced = _spec(tiny_st("cls"), attention="padded")
    assert choose_attention(forced, "cuda:1", torch.bfloat16) == (Attention.PADDED, None)
    # No kernel (cuDNN's alone masks neither causally nor by window), a GPU before Ampere,
    # a PyTorch built without flash attention.
    for gpu in ({"kernel": None, "cudnn": True}, {"capability": (7, 5)}, {"flash_built": False}):
        _a_gpu(monkeypatch, **{"capability": (8, 0), **gpu})
        attention, remark = choose_attention(spec, "cuda:0", torch.float16)
        assert attention is Attention.PADDED
        assert remark.startswith("no variable-length attention kernel runs here")
    # flash-attn's kernel needs no flash attention in PyTorch's build.
    _a_gpu(monkeypatch, (8, 6), kernel="flash-attn", flash_built=False)
    assert choose_attention(spec, "cuda:0", torch.bfloat16) == (Attention.FLAT, None)


def test_the_kernels_available_come_in_the_order_of_preference(monkeypatch):
    _a_gpu(monkeypatch, (9, 0), fa3=True, cudnn=True)
    found = kernels.available("cuda:0", torch.bfloat16)
    assert found == ["flash-attention-3", "varlen_attn", "cudnn-jagged"]
    assert kernels.preferred("cuda:0", torch.bfloat16) == "flash-attention-3"
    # flash-attention 3 is Hopper's: an A100 or an L4 takes PyTorch's kernel first.
    for capability in ((8, 0), (8, 9)):
        _a_gpu(monkeypatch, capability, fa3=True)
        assert kernels.available("cuda:0", torch.float16) == ["varlen_attn"]
    _a_gpu(monkeypatch, (8, 6), kernel="flash-attn")
    assert kernels.preferred("cuda:0", torch.float16) == "flash-attn-2"
    assert kernels.available("cuda:0", torch.float32) == []
    assert kernels.preferred("cuda:0", torch.float32) == kernels.REFERENCE
    assert kernels.available("cpu", torch.bfloat16) == []


def _stand_ins(monkeypatch, calls):
    """Kernels that stand for a GPU's, all computing on the CPU, on a check of 1,024 tokens:
    `right` (the reference), `slow` (the reference, 100 ms late), `wrong` (off by far more
    than the check allows), `unmasked` (cannot mask causally), `broken` (raises)."""
    names = ["slow", "wrong", "right", "unmasked", "broken"]
    monkeypatch.setattr(kernel_choice, "CHECK_TOKENS", 1024)
    monkeypatch.setattr(kernels, "available", lambda device, dtype: list(names))

    def call(name, query, key, value, cu, longest, causal, window):
        calls.append(name)
        if name == "broken":
            raise RuntimeError("no kernel image for this device")
        if name == "unmasked" and causal:
            return None
        lengths = np.diff(cu.numpy())
        found = reference_attention(query, key, value, Sequences.on_host(lengths), causal, window)
        if name == "slow":
            time.sleep(0.1)
        return found * 1.1 if name == "wrong" else found

    monkeypatch.setattr(kernels, "call", call)
    return names


def test_the_fastest_kernel_that_agrees_with_the_reference_is_chosen_and_recorded(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("BULKEMBED_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(kernel_choice.KERNEL_VARIABLE, raising=False)
    calls = []
    _stand_ins(monkeypatch, calls)
    shape = AttentionShape(4, 2, 8, ((False, FULL), (True, (5, -1))), 64)
    choice = choose_kernel("cpu", torch.float32, shape)
    assert choice.name == "right" and choice.how == "measured"
    assert [name for name, spent in choice.seconds.items() if spent is None] == [
        "wrong",
        "unmasked",
        "broken",
    ]
    assert choice.seconds["slow"] > 0.1 and choice.seconds["slow"] > choice.seconds["right"]
    assert "attention kernel right (measured: slow " in choice.describe()
    # A later run with the same device, dtype, versions and shape measures nothing.
    calls.clear()
    again = choose_kernel("cpu", torch.float32, shape)
    assert (again.name, again.how, calls) == ("right", "recorded", [])
    assert again.seconds == pytest.approx(choice.seconds)
    # Another shape measures again.
    assert (
        choose_kernel("cpu", torch.float32, AttentionShape(4, 4, 8, ((False, FULL),), 64)).how
        == "measured"
    )


def test_a_kernel_asked_for_is_taken_without_the_check_if_it_runs_here(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKEMBED_CACHE_DIR", str(tmp_path))
    calls = []
    _stand_ins(monkeypatch, calls)
    shape = AttentionShape(4, 4, 8, ((False, FULL),), 64)
    monkeypatch.setenv(kernel_choice.KERNEL_VARIABLE, "slow")
    assert choose_kernel("cpu", torch.float32, shape).name == "slow"
    monkeypatch.setenv(kernel_choice.KERNEL_VARIABLE, "reference")
    assert choose_kernel("cpu", torch.float32, shape).name == "reference"
    assert calls == []
    monkeypatch.setenv(kernel_choice.KERNEL_VARIABLE, "fa9")
    with pytest.raises(UsageError) as refused:
        choose_kernel("cpu", torch.float16, shape)
    assert str(refused.value) == (
        "BULKEMBED_ATTENTION_KERNEL=fa9: no such kernel runs on cpu in float16; use one of "
        "auto, slow, wrong, right, unmasked, broken, reference"
    )
    # Where no kernel runs (float32 here), the reference, whatever was asked.
    monkeypatch.setattr(kernels, "available", lambda device, dtype: [])
    choice = choose_kernel("cpu", torch.float32, shape)
    assert (choice.name, choice.how) == ("reference", "only")


def test_the_attention_shape_of_a_flat_model_names_every_mask_its_layers_ask_for():
    model = _tiny_decoder("qwen2")
    module = flat_module(flat_family(model), model)
    shape = AttentionShape.of(module, 320)
    assert shape == AttentionShape(4, 2, 8, ((True, (-1, -1)), (True, (31, -1))), 320)
    llama = _tiny_decoder("llama")
    found = AttentionShape.of(flat_module(flat_family(llama), llama), 64)
    assert found == AttentionShape(4, 2, 16, ((True, (-1, -1)),), 64)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_cuda_kernel_available_equals_the_reference(dtype):
    names = kernels.available("cuda:0", dtype)
    assert names, "no variable-length kernel runs on this GPU"
    torch.manual_seed(0)
    lengths = np.array([512, 300, 1, 77, 77, 2])
    # Strided as the fused projection's views are: [tokens, 3, heads, size], unbound.
    fused = torch.randn(int(lengths.sum()), 3, 8, 64, device="cuda", dtype=dtype)
    query, key, value = fused.unbind(1)
    sequences = Sequences.on_host(lengths).to(lambda t: t.cuda())
    expected = reference_attention(query, key, value, sequences).float()
    for name in names:
        found = _kernel_attention(query, key, value, sequences, name=name).float()
        cosine = torch.nn.functional.cosine_similarity(found, expected, dim=-1).min()
        assert cosine >= 0.9999, name


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_a_cuda_model_takes_a_kernel_that_passes_its_check(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKEMBED_CACHE_DIR", str(tmp_path))
    model = _tiny_decoder("mistral")
    module = flat_module(flat_family(model), model)
    choice = choose_kernel("cuda:0", torch.bfloat16, AttentionShape.of(module, 512))
    assert choice.how == "measured"
    assert choice.seconds[choice.name] is not None


def test_the_former_kernel_variable_is_said_to_be_no_longer_read(tiny_st, monkeypatch):
    from bulkembed.encoders import build_encoder

    spec = _spec(tiny_st("cls"), attention="flat", backend="torch")
    monkeypatch.delenv("BULKEMBED_FLASH_ATTENTION", raising=False)
    assert build_encoder(spec, "cpu", torch.float32).notices == []
    monkeypatch.setenv("BULKEMBED_FLASH_ATTENTION", "fa2")
    assert build_encoder(spec, "cpu", torch.float32).notices == [
        "BULKEMBED_FLASH_ATTENTION is no longer read: set BULKEMBED_ATTENTION_KERNEL "
        "(flash-attention-3, varlen_attn, flash-attn-2, cudnn-jagged or reference)"
    ]
