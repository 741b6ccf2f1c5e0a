"""`agentrl model import`: a GGUF file written here with the `gguf` package (a tiny llama with the
random test model's weights and vocabulary), a Hugging Face directory, resolution by name, the card,
`model info`, and the errors a user can make."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl_cli.core.errors import NotFoundError, UsageError
from agentrl_cli.model.importer import CARD, find_source, import_model, sha256_file
from agentrl_cli.model.resolve import resolve_model_path
from tests.unit.test_model_chat import NO_TOOLS


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K row order (Transformers undoes it when it reads a GGUF)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model_dir, dest) -> None:
    """The random test model as an F32 llama GGUF, its tokenizer as a gpt2-style GGUF vocabulary,
    with a chat template that has no tool support."""
    import gguf

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    c = model.config
    tokenizer_json = json.loads(tok.backend_tokenizer.to_str())
    vocab = {i: t for t, i in tokenizer_json["model"]["vocab"].items()}
    types = {i: gguf.TokenType.NORMAL for i in vocab}
    for added in tokenizer_json["added_tokens"]:
        vocab[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
    tokens = [vocab.get(i, f"[PAD{i}]") for i in range(c.vocab_size)]
    token_types = [types.get(i, gguf.TokenType.UNUSED) for i in range(c.vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer_json["model"]["merges"]]

    w = gguf.GGUFWriter(str(dest), "llama")
    w.add_name("tiny-test")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(NO_TOOLS)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _logits(model_dir, ids):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]


@pytest.fixture(scope="module")
def gguf_file(random_model_dir, tmp_path_factory):
    dest = tmp_path_factory.mktemp("gguf") / "tiny-test.Q8_0.gguf"
    write_gguf(random_model_dir, dest)
    return dest


def test_a_gguf_file_imports_as_a_model_directory_that_resolves_by_name(gguf_file, random_model_dir, tmp_path):
    card = import_model(str(gguf_file), str(tmp_path))
    assert card["name"] == "tiny-test"  # the quantisation suffix is dropped
    dest = resolve_model_path("tiny-test", str(tmp_path))
    assert dest == tmp_path / "models" / "imported" / "tiny-test"
    assert (dest / "model.safetensors").exists() and (dest / CARD).exists()
    saved = json.loads((dest / CARD).read_text())
    assert saved["source"] == {"kind": "gguf", "path": str(gguf_file.resolve()), "sha256": sha256_file(gguf_file)}
    assert saved["chat"]["tools"].startswith("fallback") and saved["chat"]["stop_tokens"] == ["<|im_end|>"]
    assert saved["parameters"] == sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(random_model_dir).parameters())
    # the imported weights are the source model's: same logits on the same ids
    ids = [5, 17, 300, 42, 9]
    assert torch.allclose(_logits(dest, ids), _logits(random_model_dir, ids), atol=1e-4)
    tok = AutoTokenizer.from_pretrained(dest)
    assert tok.chat_template == NO_TOOLS
    gen = json.loads((dest / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.convert_tokens_to_ids("<|im_end|>")]


def test_a_directory_imports_with_its_checksums_and_a_replacement_template(random_model_dir, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(NO_TOOLS)
    card = import_model(str(random_model_dir), str(tmp_path / "cache"), "mine", chat_template=str(template))
    assert card["source"]["kind"] == "directory"
    assert card["source"]["sha256"] == {"model.safetensors": sha256_file(random_model_dir / "model.safetensors")}
    assert card["chat"]["tools"].startswith("fallback")  # the replacement template has no tools
    assert AutoTokenizer.from_pretrained(card["directory"]).chat_template == NO_TOOLS
    with pytest.raises(UsageError, match="already imported"):
        import_model(str(random_model_dir), str(tmp_path / "cache"), "mine")
    import_model(str(random_model_dir), str(tmp_path / "cache"), "mine", force=True)
    assert json.loads((tmp_path / "cache/models/imported/mine" / CARD).read_text())["chat"]["tools"].startswith("native")


def test_sources_that_name_nothing_usable_are_clear_errors(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    for source, message in [(str(tmp_path / "weights.bin"), "not a .gguf"), (str(tmp_path / "empty"), "no config.json"),
                            ("no-such-package-or-path", "neither a file"), ("pytest", "ships 0 .gguf")]:
        with pytest.raises(UsageError, match=message):
            find_source(source)
    with pytest.raises(NotFoundError, match="imported: none"):
        resolve_model_path("not-imported", str(tmp_path))


@pytest.mark.e2e
def test_the_cli_imports_and_describes_a_model(cli, gguf_file, tmp_path):
    sets = ["--set", f"model.cache_dir={tmp_path}"]
    _, r = cli.json("model", "import", str(gguf_file), "--name", "tiny", *sets)
    assert r["name"] == "tiny" and r["source"]["kind"] == "gguf"
    _, info = cli.json("model", "info", *sets, "--set", "model.path=tiny")
    assert info["parameters"] == r["parameters"] and info["vocabulary"] == r["vocab_size"]
    assert info["chat"]["stop_tokens"] == ["<|im_end|>"] and info["card"]["source"]["sha256"] == sha256_file(gguf_file)
    bad = cli("model", "import", str(gguf_file), "--name", "bad/name", *sets)
    assert bad.exit_code == 2 and "not usable" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.e2e
def test_model_commands_show_examples(cli):
    for args in (["model", "import"], ["model", "info"]):
        result = cli(*args, "--help")
        assert result.exit_code == 0 and "Examples" in result.stdout and "agentrl model" in result.stdout, args
