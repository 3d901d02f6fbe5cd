"""`python -m flexnpu export-tokenizer DIR [--model M]`: the served model's tokenizer as a Hugging
Face tokenizer directory, so clients (aiperf, guidellm, `vllm bench serve --tokenizer DIR`,
lm-eval) count tokens offline exactly as the server does."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export-tokenizer",
        help="write the served model's tokenizer as a Hugging Face tokenizer directory",
        description=__doc__,
    )
    p.add_argument("out_dir", metavar="DIR")
    p.add_argument(
        "--model",
        default=None,
        help="the model `serve --model` takes (default: SmolLM2-135M-Instruct); "
        "a llama .gguf path or random:<preset>",
    )
    p.add_argument(
        "--from-export",
        metavar="EXPORT_DIR",
        default=None,
        help="the tokenizer of `serve --export` artifacts instead",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="model_max_length to record (default: the model's context length)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flexnpu.serving.gguf_loader import DEFAULT_MODEL
    from flexnpu.serving.tokenizer import save_hf_directory, tokenizer_from_json

    if args.from_export:
        import json
        import os

        with open(os.path.join(args.from_export, "tokenizer.json")) as f:
            tok = tokenizer_from_json(f.read())
        with open(os.path.join(args.from_export, "manifest.json")) as f:
            manifest = json.load(f)
        engine = manifest.get("engine") or {}
        context = int(engine.get("max_model_len") or manifest.get("max_seq_len") or 2048)
    else:
        from flexnpu.serving.loading import load_tokenizer, model_context_length

        model = args.model or DEFAULT_MODEL
        tok = load_tokenizer(model)
        context = model_context_length(model)
    files = save_hf_directory(tok, args.out_dir, args.max_model_len or context)
    print(f"wrote {', '.join(files)} to {args.out_dir}")
    return 0
