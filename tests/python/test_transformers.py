"""transformers' save_pretrained / from_pretrained through ckpt's tools (issue 28.5, 27.7).

Small models built from configs in code (no Hub download): Llama (untied and tied
embeddings), GPT-2 (tied) and BERT, in float32, float16 and bfloat16. Each is saved by
save_pretrained unsharded (one model.safetensors, no index) and sharded (a small
max_shard_size); each directory is imported with ckpt-convert, resharded with
ckpt-merge --world 3, exported unsharded and sharded; from_pretrained of every export gives
bit-identical parameters and equal logits, the safetensors package reads every file,
ckpt-verify checks every exported byte against the digests the export wrote, and the index
carries total_parameters beside total_size as transformers 5 writes it.
"""
import json
import os
import shutil

import pytest

from conftest import run_tool

if os.environ.get("CKPT_REQUIRE_TORCH"):  # scripts/test.sh's venv has them: a failure there, not a skip
    import torch
    import transformers
    from safetensors import safe_open
else:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    safe_open = pytest.importorskip("safetensors").safe_open

SHARD = "40KB"  # several shards for every model below


def configs():
    t = transformers
    return {
        "llama": (t.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                tie_word_embeddings=False), t.LlamaForCausalLM),
        "llama-tied": (t.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     tie_word_embeddings=True), t.LlamaForCausalLM),
        "gpt2": (t.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64), t.GPT2LMHeadModel),
        "bert": (t.BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=64), t.BertModel),
    }


DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def ok(*args):
    rc, out = run_tool(*args)
    assert rc == 0, f"{' '.join(map(str, args))}: rc {rc}: {out}"
    return out


def params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_bits(a, b):
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k


def logits(model, ids):
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def safetensors_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", sorted(configs()))
def test_round_trip(tmp, name, dtype):
    torch.manual_seed(0)
    config, cls = configs()[name]
    model = cls(config).to(getattr(torch, DTYPES[dtype])).eval()
    want = params(model)
    ids = torch.randint(0, config.vocab_size, (2, 7))

    saved = {"unsharded": os.path.join(tmp, "hf-one"), "sharded": os.path.join(tmp, "hf-shards")}
    model.save_pretrained(saved["unsharded"])
    model.save_pretrained(saved["sharded"], max_shard_size=SHARD)
    assert safetensors_files(saved["unsharded"]) == ["model.safetensors"]
    assert not os.path.exists(os.path.join(saved["unsharded"], "model.safetensors.index.json"))
    assert len(safetensors_files(saved["sharded"])) > 1
    with open(os.path.join(saved["sharded"], "model.safetensors.index.json")) as f:
        hf_index = json.load(f)
    # The logits of the model as from_pretrained loads save_pretrained's own files (its
    # attention kernel may differ from the one a model built from a config uses).
    dt = getattr(torch, DTYPES[dtype])
    reference = cls.from_pretrained(saved["unsharded"], dtype=dt).eval()
    same_bits(params(reference), want)
    want_logits = logits(reference, ids)

    for layout, src in saved.items():
        # Every tool takes save_pretrained's directory as it is, index or not.
        ok("ckpt-verify", src)
        imported = os.path.join(tmp, f"ckpt-{layout}")
        ok("ckpt-convert", src, imported)
        ok("ckpt-diff", src, imported)
        resharded = os.path.join(tmp, f"ckpt-{layout}-w3")
        ok("ckpt-merge", imported, resharded, "--world", "3")
        ok("ckpt-verify", resharded)

        exports = {"one": os.path.join(tmp, f"out-{layout}-one"), "shards": os.path.join(tmp, f"out-{layout}-shards")}
        ok("ckpt-convert", resharded, os.path.join(exports["one"], "model.safetensors"))
        ok("ckpt-convert", resharded, os.path.join(exports["shards"], "model.safetensors.index.json"),
           "--max-shard-size", SHARD)
        for kind, out in exports.items():
            shutil.copy(os.path.join(src, "config.json"), out)
            files = safetensors_files(out)
            assert (len(files) == 1) == (kind == "one"), files
            # The safetensors package reads every file; ckpt's digests sit in __metadata__ as strings.
            for f in files:
                with safe_open(os.path.join(out, f), framework="pt") as st:
                    meta = st.metadata()
                    assert meta["format"] == "pt"
                    assert meta["ckpt.block_bytes"] == "65536" and meta["ckpt.digest"].startswith("xxh3-64:")
                    for k in st.keys():
                        assert f"ckpt.blocks.{k}" in meta
                        assert torch.equal(st.get_tensor(k).view(torch.uint8), want[k].view(torch.uint8)), k
            if kind == "shards":
                with open(os.path.join(out, "model.safetensors.index.json")) as f:
                    index = json.load(f)
                md = index["metadata"]
                # As transformers 5 writes it: total_parameters beside total_size, and the same values.
                assert set(md) == set(hf_index["metadata"]) == {"total_parameters", "total_size"}
                assert md == hf_index["metadata"], (md, hf_index["metadata"])
                assert set(index["weight_map"]) == set(hf_index["weight_map"])
            ok("ckpt-verify", out)
            for f in files:
                ok("ckpt-verify", os.path.join(out, f))
            back = cls.from_pretrained(out, dtype=dt).eval()
            same_bits(params(back), want)
            assert torch.equal(logits(back, ids), want_logits), (name, dtype, layout, kind)
