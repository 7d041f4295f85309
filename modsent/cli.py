"""The `modsent` command line.

    modsent languages [--paper]           the language registry (code, FLORES-200, NLLB, script, name)
    modsent check-config FILE [FILE ...]  check configs against the schema without running anything
    modsent encode --model DIR --lang de < sentences.txt > embeddings.npy
                                          sentence embeddings; DIR is an exported encoder
                                          (ModularEncoder.export) or a results/{base} tree
    modsent export --model results/me5-small --lang ky --out ky-encoder
                                          one language's encoder of a modular system as a
                                          sentence-transformers directory with a model card
    modsent push ky-encoder --repo-id ORG/NAME   that directory to the Hugging Face Hub
    modsent outputs --lang de             a language's existing outputs, to rerun it with
                                          snakemake --forcerun $(modsent outputs --lang de)
    modsent plan --configfile FILE        jobs, GPU-hours and disk of a config's run
    modsent fetch --configfile FILE       what its run reads from the Hub, fetched here (for
                                          compute nodes without internet access)
"""

from __future__ import annotations

import argparse
import contextlib
import sys


PAPER_LANGUAGES = "am ar az cs de en es fr ha it kk ko ky mr nl pl ru rw te tr ug uz zh".split()


def cmd_languages(args: argparse.Namespace) -> int:
    from modsent import languages as registry

    codes = PAPER_LANGUAGES if args.paper else registry.codes()
    print("code\tflores\tnllb\tscript\tname")
    for code in codes:
        lang = registry.get(code)
        print(f"{lang.code}\t{lang.flores}\t{lang.nllb or '-'}\t{lang.script}\t{lang.name}")
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from modsent.config import ConfigError, check_config, read_config_file

    failed = 0
    for path in args.files:
        try:
            config = read_config_file(path)
            check_config(config)
            print(f"{path}: ok")
        except ConfigError as err:
            print(err if str(err).startswith(f"{path}: ") else f"{path}: {err}", file=sys.stderr)
            failed += 1
        except OSError as err:
            print(f"{path}: {err}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def _input_lines(args):
    """(line number, text) of --input or stdin, decoded strictly: invalid UTF-8 is an
    InputError naming the input, the line and the byte."""
    from modsent.io import InputError, iter_utf8_lines

    if args.input:
        yield from iter_utf8_lines(args.input)
        return
    for number, raw in enumerate(sys.stdin.buffer, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"stdin: line {number}: invalid UTF-8 at byte {err.start} of the line "
                             f"({raw[max(0, err.start - 10):err.start + 10]!r}); the input must be UTF-8 text") from None
        yield number, text.rstrip("\r\n")


def _read_sentences(args) -> list[str]:
    import json

    from modsent.io import InputError

    where = args.input or "stdin"
    if args.input_format == "txt":
        return [line for _, line in _input_lines(args)]
    if args.input_format == "jsonl":
        sentences = []
        for number, line in _input_lines(args):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{where}: line {number}: not JSON ({err.msg}); --input-format jsonl "
                                 "reads one object a line") from None
            if not isinstance(row, dict) or args.column not in row:
                found = ", ".join(map(str, row)) if isinstance(row, dict) else type(row).__name__
                raise InputError(f"{where}: line {number}: no {args.column!r} field (found: {found}); "
                                 "--column names the text field")
            if not isinstance(row[args.column], str):
                raise InputError(f"{where}: line {number}: {args.column!r} is not a string")
            sentences.append(row[args.column])
        return sentences
    import pandas as pd
    import pyarrow
    import pyarrow.parquet as pq

    try:
        columns = pq.read_schema(args.input).names
    except pyarrow.ArrowException as err:
        raise InputError(f"{args.input}: not a parquet file ({err}); --input-format says which") from None
    if args.column not in columns:
        raise InputError(f"{args.input}: no column {args.column!r} (columns: {', '.join(columns)}); "
                         "--column names the text column")
    texts = pd.read_parquet(args.input, columns=[args.column])[args.column]
    bad = [i for i, text in enumerate(texts.tolist()) if not isinstance(text, str)]
    if bad:
        value = texts.iloc[bad[0]]
        raise InputError(f"{args.input}: column {args.column!r}, row {bad[0] + 1} (of {len(bad)} such rows): "
                         + ("null, not a sentence" if pd.isna(value) else f"{value!r} is not a string"))
    return texts.tolist()


def _write_embeddings(args, sentences: list[str], vectors, langs: list[str | None],
                      detected: list[str] | None) -> None:
    """npy: the vectors alone. jsonl/parquet: per sentence its text, the language whose modules
    encoded it (``lang``) and, where it was identified rather than given, the identified
    language (``detected_lang``: differs from ``lang`` where the fallback was used)."""
    import io
    import json

    import numpy as np

    if args.output_format == "npy":
        if args.output:
            # np.save's name: ".npy" added where the name lacks it
            target = args.output if _special_file(args.output) or args.output.endswith(".npy") else args.output + ".npy"
            with _output_file(target, "wb") as handle:
                np.save(handle, vectors)
        else:
            buffer = io.BytesIO()
            np.save(buffer, vectors)
            sys.stdout.buffer.write(buffer.getvalue())
        return
    columns = {args.column: sentences, "lang": langs}
    if detected is not None:
        columns["detected_lang"] = detected
    if args.output_format == "jsonl":
        def write(target) -> None:
            for i, vector in enumerate(vectors):
                row = {key: values[i] for key, values in columns.items()}
                target.write(json.dumps({**row, "embedding": vector.tolist()}, ensure_ascii=False) + "\n")

        if args.output:
            with _output_file(args.output, "w") as handle:
                write(handle)
        else:
            write(sys.stdout)
        return
    import pandas as pd

    with _output_file(args.output, "wb") as handle:
        pd.DataFrame({**columns, "embedding": list(vectors)}).to_parquet(handle, index=False)


def _special_file(path: str) -> bool:
    """An existing output that is no regular file (/dev/stdout, a named pipe): written in place."""
    import os
    import stat

    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def _output_file(path: str, mode: str):
    """The output file, opened: a regular file is written aside and renamed into place once
    complete (io.atomic_path), a device or pipe written directly."""
    from modsent.io import atomic_path

    encoding = None if "b" in mode else "utf-8"
    if _special_file(path):
        with open(path, mode, encoding=encoding) as handle:
            yield handle
        return
    with atomic_path(path) as tmp, open(tmp, mode, encoding=encoding) as handle:
        yield handle


def check_encode_arguments(args: argparse.Namespace) -> None:
    """What ``modsent encode`` reads and writes, checked before it reads a sentence or loads a
    model: the model directory, the input file, the output's directory and format."""
    from pathlib import Path

    from modsent.io import InputError

    if not Path(args.model).is_dir():
        raise InputError(f"--model {args.model}: no such directory (an export, a method's system or results/BASE)")
    if args.batch_size < 1:
        raise InputError(f"--batch-size {args.batch_size}: must be at least 1 (sentences a batch)")
    check_lang("--lang", args.lang)
    check_lang("--fallback-lang", args.fallback_lang)
    if args.input is not None and (not Path(args.input).exists() or Path(args.input).is_dir()):
        raise InputError(f"--input {args.input}: no such file")
    if args.input_format == "parquet" and args.input is None:
        raise InputError("--input-format parquet needs --input FILE")
    if args.output_format == "parquet" and args.output is None:
        raise InputError("--output-format parquet needs --output FILE")
    if args.output is not None:
        parent = Path(args.output).resolve().parent
        if not parent.is_dir():
            raise InputError(f"--output {args.output}: no directory {parent} to write it in")
        if Path(args.output).is_dir():
            raise InputError(f"--output {args.output}: a directory; name the file to write")


def check_device(device: str | None) -> str | None:
    """``--device`` as torch understands it (cpu, cuda, cuda:1, mps), checked before any model
    loads; None: the default (the first GPU when there is one, else the CPU)."""
    if device is None:
        return None
    import torch

    from modsent.io import InputError

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f"--device {device!r}: not a device (cpu, cuda, cuda:N, mps)") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count or count == 0:
            raise InputError(f"--device {device}: this machine has {count} CUDA device(s)")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--device {device}: MPS is not available on this machine")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise InputError(f"--device {device}: only cpu, cuda[:N] and mps are supported")
    return str(parsed)


def results_system(root, name: str, merge_weight: float | None = None):
    """System ``name`` of the results tree ``root`` (results/{base}): modsent's own (the registry,
    with modsent's training methods loaded), or a system of a method outside modsent (the
    config's method_modules) that the workflow trained there: a method's name, never a path of
    another directory, whose directory holds a sentence-transformers model. An InputError
    ("unknown variant") otherwise. Mod_c is merged with ``merge_weight`` (``--merge-weight``), by
    default with the weight of the tree's one merge (:func:`mod_c_weight`)."""
    from pathlib import Path

    from modsent import layout, methods
    from modsent.encoders import systems as variants
    from modsent.io import InputError

    methods.load()
    if merge_weight is not None and name != "Mod_c":
        raise InputError(f"--merge-weight {merge_weight:g}: only Mod_c takes one (--variant {name}; the merged "
                         "modular systems name theirs: Mod_mc-0.7)")
    if name == "Mod_c":
        return variants.ablation(name, [mod_c_weight(Path(root), merge_weight)])
    try:
        return variants.variant(name)
    except InputError:
        named = methods.NAME.fullmatch(name) and not methods.RESERVED.fullmatch(name)
        if not named or not (Path(root) / layout.method_relative(name) / "modules.json").is_file():
            raise
        return variants.MethodSystem(name, "")


def mod_c_weight(root, given: float | None) -> float:
    """The merge weight of Mod_c in the results tree ``root``: ``given`` (in [0, 1]), else the
    weight of the one merge of the ablation's alignment adapters there (the workflow merges
    them with the first of ``alignment.merge_weights`` only, the weight it evaluates); an
    InputError when there is none, or several (a config whose first weight changed) and none
    was given."""
    import re

    from modsent import layout
    from modsent.encoders.systems import WEIGHT
    from modsent.io import InputError

    if given is not None:
        if not 0 <= given <= 1:
            raise InputError(f"--merge-weight {given:g}: must be in [0, 1]")
        return float(given)
    folder = root / layout.ABLATION_ALIGNMENT
    merged = sorted(name for name in (p.name.removeprefix("merged-") for p in folder.glob("merged-*")
                                      if p.is_dir() and any(c.is_dir() and "." not in c.name for c in p.iterdir()))
                    if re.fullmatch(WEIGHT, name))  # a merge that holds a language's adapter
    if len(merged) == 1:
        return float(merged[0])
    if not merged:
        raise InputError(f"--variant Mod_c: no merged alignment adapters under {folder} (has the workflow trained "
                         "the ablation? baselines.ablations selects Mod_c)")
    raise InputError(f"--variant Mod_c: {folder} holds merges of weights {', '.join(merged)}; give --merge-weight W "
                     "(the workflow evaluates Mod_c with the first of alignment.merge_weights)")


def check_results_tree(root) -> None:
    """An InputError unless ``root`` is a results/{base} tree of the workflow (it holds a stage's
    outputs: language_adapters/, sentence_adapters/, baselines/, methods/, ...)."""
    from modsent.io import InputError

    if not root.is_dir():
        raise InputError(f"--model {root}: no such directory (results/BASE of a run)")
    if not any((root / name).is_dir() for name in RESULTS_TREE_FOLDERS):
        raise InputError(f"--model {root}: neither a sentence-transformers directory (no modules.json) nor a results "
                         f"tree of the workflow (results/BASE: no {', '.join(f'{n}/' for n in RESULTS_TREE_FOLDERS)})")


# what a results/{base} tree holds once any stage ran (modsent.layout)
RESULTS_TREE_FOLDERS = ("language_adapters", "sentence_adapters", "alignment", "baselines", "methods", "ablations",
                        "eval", "tokenizers")


def check_lang(option: str, lang: str | None) -> None:
    """``--lang`` (or ``--fallback-lang``): None or a registered language code, checked before
    anything loads (a code spelt otherwise, ``DE``, is named with the code to write)."""
    from modsent import languages
    from modsent.io import InputError

    if lang is not None and not languages.is_registered(lang):
        raise InputError(f"{option} {lang}: {languages.unknown_message(lang)}")


def load_encoder(model: str, lang: str | None, base: str | None, variant: str | None, device: str | None = None,
                 merge_weight: float | None = None):
    """An encoder for ``model``: a sentence-transformers directory (an export, one language's:
    another ``lang`` is an InputError; or a method's system, every language's), or a
    results/{base} tree from which :func:`modsent.encoders.systems.build_encoder` assembles
    system ``variant`` (None: Mod_mc) for ``lang`` (or every language with a
    sentence-encoding adapter); a monolithic system (Full_*, a method's) encodes any language.
    ``variant`` with a sentence-transformers directory (one system) is an InputError."""
    from pathlib import Path

    from modsent.encoders import systems as variants
    from modsent.io import InputError
    from modsent.encoders.modular import EXPORT_INFO, export_info

    root = Path(model)
    if (root / "modules.json").is_file():
        if merge_weight is not None:
            raise InputError(f"--merge-weight {merge_weight:g}: {root} is a sentence-transformers directory, whose "
                             "modules are merged already (the option picks Mod_c's merge in a results tree)")
        if variant is not None:
            raise InputError(f"--variant {variant}: {root} is one system (an export or a method's directory); "
                             "--variant picks a system of a results tree (results/BASE)")
        # an export holds one language's modules; a method's system (no export_info.json) every language's
        exported = export_info(root)["language"] if (root / EXPORT_INFO).is_file() else None
        if exported is not None and lang is not None and lang != exported:
            raise InputError(f"{root} is the export of {exported!r}: it does not encode {lang!r} "
                             f"(use --lang {exported}, or a results tree for other languages)")
        return variants.SentenceTransformerEncoder(root, device, language=exported)
    check_results_tree(root)
    variant = variant or "Mod_mc"
    system = results_system(root, variant, merge_weight)
    if system.kind == "full":  # a monolithic system (Full_*, a method's): any language
        return variants.build_encoder(variant, root, root, [], device=device, system=system)
    base_dir = Path(base) if base else root.parent.parent / "resources" / "base_models" / root.name
    if not (base_dir / "config.json").is_file():
        raise InputError(f"{base_dir}: no base model there; give it with --base")
    available = sorted(p.name for p in (root / "sentence_adapters").glob("*") if p.is_dir() and "." not in p.name)
    if lang is not None and lang not in available:
        raise InputError(f"no modules for language {lang!r} under {root}; available: {', '.join(available) or 'none'}")
    return variants.build_encoder(variant, root, base_dir, [lang] if lang else available, device=device,
                                  system=system)


def cmd_encode(args: argparse.Namespace) -> int:
    import numpy as np
    from tqdm.auto import tqdm

    from modsent.encoders.modular import ModularEncoder

    check_encode_arguments(args)
    device = check_device(args.device)
    sentences = _read_sentences(args)
    encoder = load_encoder(args.model, args.lang, args.base, args.variant, device, args.merge_weight)
    detected = None
    if isinstance(encoder, ModularEncoder) and args.lang is None:
        langs, detected = encoder.route(sentences, args.fallback_lang) if sentences else ([], [])
        counts = ", ".join(f"{lang} {langs.count(lang)}" for lang in dict.fromkeys(langs))
        print(f"modsent encode: languages identified per sentence: {counts or 'none'}", file=sys.stderr)
    else:  # a named language, an export (its own language) or a monolithic model (any language)
        langs = [args.lang or getattr(encoder, "language", None)] * len(sentences)
    step = args.batch_size * 8
    chunks = []
    with tqdm(total=len(sentences), unit="sentence", file=sys.stderr, disable=args.quiet) as bar:
        for start in range(0, len(sentences), step):
            batch = sentences[start:start + step]
            if isinstance(encoder, ModularEncoder):
                chunks.append(encoder.encode_by_language(batch, langs[start:start + step], args.batch_size))
            else:
                chunks.append(encoder.encode(batch, lang=args.lang, batch_size=args.batch_size))
            bar.update(len(batch))
    vectors = np.concatenate(chunks) if chunks else np.zeros((0, encoder.embedding_dimension), dtype=np.float32)
    bad = int((~np.isfinite(vectors)).any(axis=1).sum())
    if bad:
        from modsent.io import InputError

        raise InputError(f"{args.model}: {bad} of {len(sentences)} embeddings are not finite (NaN or inf): "
                         "the model holds non-finite weights; nothing was written")
    _write_embeddings(args, sentences, vectors.astype(np.float32), langs, detected)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """One language's encoder of a modular system, or a monolithic system (a full baseline or a
    recipe's model), as a plain sentence-transformers directory with a model card (modsent.cards)."""
    from pathlib import Path

    from modsent import cards
    from modsent.encoders import systems as variants
    from modsent.encoders.base_models import hub_id
    from modsent.encoders.modular import ModularEncoder
    from modsent.io import InputError

    root = Path(args.model)
    if (root / "modules.json").is_file():
        raise InputError(f"{root} is a sentence-transformers directory already; export reads a results/{{base}} tree")
    check_results_tree(root)
    check_lang("--lang", args.lang)
    system = results_system(root, args.variant, args.merge_weight)
    out = Path(args.out)
    if out.exists() and not args.force:
        raise InputError(f"{out} exists; remove it or give --force")
    builtin_data = (root.parent.parent / "resources" / "paraphrases" / "builtin.parquet").is_file()
    if system.kind not in ("modular", "base"):
        return _export_monolithic(args, root, system, out, builtin_data)
    if not args.lang:
        raise InputError(f"--variant {args.variant}: a modular system is exported one language at a time: give --lang")
    encoder = load_encoder(str(root), args.lang, args.base, args.variant, check_device(args.device),
                           args.merge_weight)
    assert isinstance(encoder, ModularEncoder)
    modules = variants._modules(system, root, args.lang)
    base_dir = encoder.base_model_dir
    text = cards.export_card(language=args.lang, base_model=hub_id(base_dir), system=args.variant, modules=modules,
                             results_dir=root, license=args.license, builtin_data=builtin_data)
    cards.check_card(text)
    encoder.export(args.lang, out, card=text)
    print(f"modsent export: {args.variant} for {args.lang} in {out} (model card: {out / cards.CARD})", file=sys.stderr)
    return 0


def _export_monolithic(args: argparse.Namespace, root, system, out, builtin_data: bool) -> int:
    """A trained monolithic system's directory, copied with a model card written into it."""
    import shutil
    from pathlib import Path

    from modsent import cards
    from modsent.encoders.base_models import hub_id
    from modsent.io import InputError, atomic_path, check_model_files

    source = Path(root) / system.path
    if not (source / "modules.json").is_file():
        raise InputError(f"--variant {args.variant}: {source} is not a trained sentence-transformers directory "
                         "(has the workflow trained it? snakemake plans it when it is configured)")
    if args.lang:
        print(f"modsent export: {args.variant} is one model for every language; --lang {args.lang} is ignored",
              file=sys.stderr)
    check_model_files(source)
    base_dir = Path(args.base) if args.base else Path(root).parent.parent / "resources" / "base_models" / Path(root).name
    text = cards.system_card(system=args.variant, system_dir=source, base_model=hub_id(base_dir),
                             results_dir=Path(root), license=args.license, builtin_data=builtin_data)
    cards.check_card(text)
    with atomic_path(out, directory=True) as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.checkpoint", "loss.tsv"))
        (Path(tmp) / cards.CARD).write_text(text, encoding="utf-8")
    print(f"modsent export: {args.variant} in {out} (model card: {out / cards.CARD})", file=sys.stderr)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Jobs per rule of a config, and GPU-hours and disk of its training stages (modsent.planning)."""
    import tempfile
    from pathlib import Path

    from modsent import planning
    from modsent.io import InputError

    if args.directory and not Path(args.directory).is_dir():
        raise InputError(f"--directory {args.directory}: no such directory (a run's working directory; without "
                         "--directory the plan is a new run's)")
    if not args.scale > 0:
        raise InputError(f"--scale {args.scale:g}: must be above 0 (a factor on every time)")
    config = planning.load_filled_config(args.configfile)
    rates = planning.RATES[args.rates]
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.directory or scratch
        jobs, cluster = planning.dry_run(args.configfile, directory, profile=args.profile)
        estimates = planning.estimate(config, jobs, directory, rates, args.scale)
        print(planning.format_plan(estimates, rates, args.configfile,
                                   args.directory or "a new directory (everything)", args.scale,
                                   profile=args.profile, cluster=cluster))
    return 1 if cluster is not None and cluster.problems else 0


def cmd_fetch(args: argparse.Namespace) -> int:
    """What a config's run reads from the Hub, fetched here for compute nodes without internet
    access (modsent.fetch): the Hub models jobs load by id into the Hub cache, then the input
    rules run with Snakemake."""
    import subprocess
    from pathlib import Path

    from modsent import fetch, planning

    config = planning.load_filled_config(args.configfile)
    directory = Path(args.directory)
    models = fetch.hub_models(config, directory)
    for model in models:
        print(f"{model.key}: {model.repo_id} (revision {model.revision or 'main'})")
    if not models:
        print("no Hub model that a job loads by id (the base model and the translation model's conversion are "
              "input rules')")
    elif not args.dry_run:
        from huggingface_hub import constants

        from modsent.encoders.tf_checkpoint import converted_root

        folders = fetch.download(models, directory)
        converted = [folder for folder in folders if converted_root() in folder.parents]
        print(f"downloaded {len(folders)} model(s) into the Hub cache {constants.HF_HUB_CACHE}"
              + (f"; {len(converted)} converted from TensorFlow weights into {converted_root()} (the compute "
                 "nodes need this HF_HOME too)" if converted else ""))
    rules = fetch.input_rules(args.configfile, directory)
    cmd = fetch.input_command(args.configfile, directory, args.cores, rules, ["--dry-run"] if args.dry_run else [],
                              profile=args.profile)
    print("running the input rules here:", " ".join(cmd[cmd.index("--until"):]), flush=True)
    status = subprocess.run(cmd, env=fetch.local_environment()).returncode
    if status == 0 and not args.dry_run:
        print(f"the inputs are in {directory.resolve() / 'resources'}; submit the rest from {directory.resolve()}, "
              f"e.g. HF_HUB_OFFLINE=1 snakemake --profile {args.profile or 'slurm'} --configfile "
              f"{Path(args.configfile).resolve()}"
              + (" (the compute nodes need the same Hub cache: HF_HOME on the shared file system)" if models else ""))
    return status


def cmd_convert_tf(args: argparse.Namespace) -> int:
    """The encoder of a T5/mT5 checkpoint that has only pickled and TensorFlow weights on the Hub
    (google/mt5-xxl) as a safetensors directory, read from its HDF5 file (nothing unpickled)."""
    from modsent.encoders.tf_checkpoint import convert

    out = convert(args.source, args.output, revision=args.revision, progress=not args.quiet)
    print(f"modsent convert-tf: {args.source} -> {out}; give it as a method's model: {out.resolve()}",
          file=sys.stderr)
    return 0


def planning_rates() -> list[str]:
    from modsent.planning import RATES

    return list(RATES)


def cmd_push(args: argparse.Namespace) -> int:
    """An export (or any sentence-transformers directory with a model card) to the Hub, with
    huggingface_hub's own upload: the repository is created when missing."""
    from pathlib import Path

    from huggingface_hub import HfApi
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    from modsent.cards import CARD
    from modsent.encoders.base_models import PICKLE_SUFFIXES
    from modsent.io import InputError

    folder = Path(args.folder)
    if not (folder / "modules.json").is_file():
        raise InputError(f"{folder}: not a sentence-transformers directory (no modules.json)")
    if not (folder / CARD).is_file():
        raise InputError(f"{folder}: no model card ({CARD}); make the directory with `modsent export`")
    pickles = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.suffix in PICKLE_SUFFIXES]
    if pickles:
        raise InputError(f"{folder}: pickled files are not pushed: {', '.join(pickles)}")
    try:
        validate_repo_id(args.repo_id)
    except HFValidationError as err:
        raise InputError(f"--repo-id {args.repo_id!r}: {err}") from None
    api = HfApi(token=args.token)
    url = api.create_repo(args.repo_id, private=args.private, exist_ok=True, repo_type="model")
    api.upload_folder(repo_id=args.repo_id, folder_path=str(folder), repo_type="model",
                      commit_message=args.message)
    print(f"modsent push: {folder} -> {url}", file=sys.stderr)
    return 0


def language_outputs(langs: list[str], directory: str = ".", base: str | None = None) -> list[str]:
    """The existing outputs of ``langs`` under ``directory`` (all bases, or ``base``)."""
    from glob import escape, glob
    from pathlib import Path

    from modsent import layout

    root = Path(directory)
    found: list[str] = []
    bases = [escape(base), escape(base) + layout.SEED_SEPARATOR + "*"] if base else ["*"]  # and its seed replicates
    for lang in langs:
        for pattern in (p for b in bases for p in layout.language_outputs(escape(lang), b)):
            found += sorted(str(Path(path).relative_to(root)) for path in glob(str(root / pattern))
                            if not Path(path).name.startswith("."))
    return list(dict.fromkeys(found))


def cmd_outputs(args: argparse.Namespace) -> int:
    from modsent import languages as registry

    unknown = [lang for lang in args.lang if lang not in registry.codes()]
    if unknown:
        print(f"modsent outputs: unknown language code(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    paths = language_outputs(args.lang, args.directory, args.base)
    if not paths:
        print(f"modsent outputs: no outputs of {', '.join(args.lang)} under {args.directory}", file=sys.stderr)
        return 1
    print("\n".join(paths))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modsent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("languages", help="list the language registry")
    p.add_argument("--paper", action="store_true", help="only the paper's 23 languages")
    p.set_defaults(func=cmd_languages)
    p = sub.add_parser("check-config", help="check config files against the schema")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_check_config)
    p = sub.add_parser("encode", help="encode sentences (stdin or --input) into embeddings")
    p.add_argument("--model", required=True, help="exported encoder directory or results/{base}")
    p.add_argument("--lang", help="language code; omitted: identified per sentence (a language without "
                   "modules is an error unless --fallback-lang names one)")
    p.add_argument("--fallback-lang", help="without --lang: the modules for sentences identified as a "
                   "language that has none (counted on stderr, recorded in jsonl/parquet output)")
    p.add_argument("--base", help="base model directory (default: resources/base_models/{base})")
    p.add_argument("--variant", help="the system to assemble from a results tree (default: Mod_mc): Mod_mc "
                   "(merged alignment, weight 0.5), Mod_mc-0.7, Mod_mc-pp, Mod_mc-pl, Mod_m, Mod_en, base, Full_m, "
                   "a method's system (InteMATs, mST5-xnli, ...)")
    p.add_argument("--merge-weight", type=float, help="Mod_c only: the merge weight of its alignment adapters "
                   "(default: the one the results tree holds, the first of alignment.merge_weights, which the "
                   "workflow evaluated)")
    p.add_argument("--input", help="input file (default: stdin)")
    p.add_argument("--input-format", choices=["txt", "jsonl", "parquet"], default="txt")
    p.add_argument("--output", help="output file (default: stdout)")
    p.add_argument("--output-format", choices=["npy", "jsonl", "parquet"], default="npy")
    p.add_argument("--column", default="text", help="text column of jsonl/parquet input and output")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: the first GPU when there is one, "
                   "else the CPU)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_encode)
    p = sub.add_parser("export", help="one language's encoder of a modular system, or a monolithic system (full "
                       "baseline, recipe), as a sentence-transformers directory with a model card")
    p.add_argument("--model", required=True, help="results/{base}")
    p.add_argument("--lang", help="language code (modular systems: required)")
    p.add_argument("--variant", default="Mod_mc", help="the system: modular (Mod_mc, Mod_mc-0.7, Mod_mc-pl, "
                   "Mod_m, Mod_en, Mod_c, base, ...) or monolithic (Full_m, Full_mc, a configured recipe's name)")
    p.add_argument("--merge-weight", type=float, help="Mod_c only: the merge weight of its alignment adapters "
                   "(default: the one the results tree holds, the first of alignment.merge_weights, which the "
                   "workflow evaluated)")
    p.add_argument("--base", help="base model directory (default: resources/base_models/{base})")
    p.add_argument("--out", required=True, help="the directory to write")
    p.add_argument("--license", help="the licence's Hub id for the card (e.g. apache-2.0); default: none set")
    p.add_argument("--device", help="where to merge the modules (default: the first GPU, else the CPU)")
    p.add_argument("--force", action="store_true", help="replace --out when it exists")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("push", help="an export to the Hugging Face Hub (huggingface_hub's upload_folder)")
    p.add_argument("folder", help="the export directory")
    p.add_argument("--repo-id", required=True, help="user/name or org/name on the Hub")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--token", help="a Hub token (default: huggingface-cli login's)")
    p.add_argument("--message", default="Upload a modsent encoder", help="the commit message")
    p.set_defaults(func=cmd_push)
    p = sub.add_parser("plan", help="jobs per rule of a config, and GPU-hours and disk of its training stages")
    p.add_argument("--configfile", default="config.yaml", help="the config (default: the demo's config.yaml)")
    p.add_argument("--directory", help="the working directory whose remaining work to plan (default: a new, empty "
                   "one: everything; relative local: paths in the config need the run's own directory)")
    p.add_argument("--rates", choices=sorted(planning_rates()), default="h200",
                   help="per-stage GPU rates: h200 or h100 (measured by modsent's benchmarks) or a100-paper (Table 5)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every time (a body larger than LaBSE's 12 x 768, a slower GPU)")
    p.add_argument("--profile", help="the Snakemake profile the run will use (e.g. slurm): its set-resources "
                   "and default-resources decide the time each job asks for; under a SLURM profile every "
                   "job's request is checked against sinfo's nodes, as the run does before it submits "
                   "anything (exit status 1 when a value of the profile fits no node, 2 when a request "
                   "of the config's does)")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("fetch", help="what a config's run reads from the Hub, fetched on this machine for compute "
                       "nodes without internet access: the models jobs load by id into the Hub cache, then the "
                       "input rules (base model, corpora, datasets, the translation model's conversion)")
    p.add_argument("--configfile", default="config.yaml", help="the config (default: the demo's config.yaml)")
    p.add_argument("--directory", default=".", help="the run's working directory, where resources/ is written "
                   "(default: here)")
    p.add_argument("--cores", type=int, default=2, help="cores for the input rules (default: 2)")
    p.add_argument("--profile", help="the cluster run's profile, for its software deployment (conda, ...): the "
                   "input rules still run here ($SNAKEMAKE_PROFILE is not read)")
    p.add_argument("--dry-run", action="store_true", help="list the models and the input rules' jobs; "
                   "download and run nothing")
    p.set_defaults(func=cmd_fetch)
    p = sub.add_parser("convert-tf", help="the encoder of a T5/mT5 model whose Hub repository has no safetensors, "
                       "only pickles and TensorFlow weights (google/mt5-xxl), as a safetensors directory: its "
                       "tf_model.h5 read with h5py, nothing unpickled")
    p.add_argument("source", help="a Hub id (e.g. google/mt5-xxl) or a directory with tf_model.h5 and config.json")
    p.add_argument("output", help="the new directory to write (a method's model: setting)")
    p.add_argument("--revision", help="the Hub revision (default: main)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_convert_tf)
    p = sub.add_parser("outputs", help="a language's existing outputs (for snakemake --forcerun)")
    p.add_argument("--lang", action="append", required=True, help="language code (repeatable)")
    p.add_argument("--base", help="only results/BASE (default: every base model's results)")
    p.add_argument("--directory", default=".", help="the workflow's working directory")
    p.set_defaults(func=cmd_outputs)
    args = parser.parse_args(argv)
    if getattr(args, "fallback_lang", None) and args.lang:
        parser.error("--fallback-lang applies only without --lang")
    from modsent.io import InputError

    try:
        return args.func(args)
    except InputError as err:
        print(f"modsent {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
