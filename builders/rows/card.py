"""The data card beside every build: ``NAME.md``, with plots.

It is in the Hugging Face dataset-card format. Everything in it is a function of the manifest, the
rows and the toolchain (no timings, no dates), so the same build gives the same card, byte for byte,
plots included. The folder's ``README.md`` is the latest build's card with the front matter that
``datasets`` and the Hub read (``builders.rows.hub``).
"""

from __future__ import annotations

import io
import json

import numpy as np
import yaml

from builders.manifest import PINNED_BY_MANIFEST, Manifest, is_shipped
from builders.rows.figures import NOTHING_PINNED, Check, Verification
from builders.rows.hub import write_readme
from builders.rows.stats import BuildStats
from builders.runtime.atomic import Outputs

LICENSE_IDS = {
    "odc-by 1.0": "odc-by",
    "odc-by": "odc-by",
    "cc0-1.0 (generated)": "cc0-1.0",
    "cc0-1.0": "cc0-1.0",
    "apache-2.0": "apache-2.0",
    "mit": "mit",
}
PLOTS = ("tokens-per-source", "conversation-lengths", "row-supervision")


def size_category(rows: int) -> str:
    for limit, name in (
        (1_000, "n<1K"),
        (10_000, "1K<n<10K"),
        (100_000, "10K<n<100K"),
        (1_000_000, "100K<n<1M"),
    ):
        if rows < limit:
            return name
    return "n>1M"


def write_card(outputs: Outputs, manifest: Manifest, report: dict, stats: BuildStats) -> None:
    """Stage ``NAME.md`` and its PNG plots among the build's ``outputs``.

    The outputs' commit puts them in place.
    """
    for plot, draw in zip(PLOTS, (_plot_sources, _plot_lengths, _plot_supervision), strict=True):
        outputs.write(f"{manifest.name}.{plot}.png", draw(stats, manifest))
    text = card_text(manifest, report, stats)
    outputs.write(f"{manifest.name}.md", text.encode("utf-8"))
    write_readme(
        outputs,
        card_metadata(manifest, report["figures"]["rows"]),
        report,
        text.removeprefix(front_matter(manifest, report["figures"]["rows"])),
    )


def _workers(report: dict) -> str:
    count = report["workers"]
    return "the building process itself" if count == 1 else f"{count} worker processes"


def front_matter(manifest: Manifest, rows: int | None = None) -> str:
    """The card's YAML metadata block.

    A YAML writer emits it, so any manifest text stays valid YAML. ``rows``: the rows built
    (default: the manifest's).
    """
    meta = card_metadata(manifest, rows)
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n"


def card_metadata(manifest: Manifest, rows: int | None = None) -> dict:
    """What the card's front matter says: license, name, tags.

    ``rows``: the rows built (default: the manifest's; none for ``rows: all``: no size category).
    """
    rows = manifest.rows if rows is None else rows
    licenses = list(dict.fromkeys(pin.license or "" for pin in manifest.datasets))
    ids = {LICENSE_IDS.get(name.lower(), "other") for name in licenses}
    license_id = ids.pop() if len(ids) == 1 else "other"
    meta = {"license": license_id}
    if license_id == "other" and any(licenses):
        meta["license_name"] = "; ".join(name for name in licenses if name)
    meta |= {
        "pretty_name": manifest.name,
        "task_categories": ["text-generation"],
        "size_categories": [] if rows is None else [size_category(rows)],
        "source_datasets": list(dict.fromkeys(pin.repo for pin in manifest.datasets if pin.repo)),
        "tags": ["sft", "pretokenized", "fixed-sft", f"loss-mask-{manifest.loss_mask}"],
    }
    return meta


def card_text(manifest: Manifest, report: dict, stats: BuildStats) -> str:
    """The card's text, from the build's report.

    Nothing in it varies from run to run: no timings.
    """
    figures, engine = report["figures"], report["engine"]
    tok, name = manifest.tokenizer, manifest.name
    origin = (
        _origin(manifest.dataset)
        if not manifest.mixture
        else f"a mixture of {len(manifest.datasets)} datasets (below)"
    )
    summary = stats.summary()
    verification = Verification([Check(**check) for check in report["checks"]], [])
    unpinned = verification.verified and verification.nothing_pinned
    outcome = (
        "NOT verified"
        if not verification.verified
        else NOTHING_PINNED.capitalize()
        if unpinned
        else "Verified"
    )
    lines = [
        front_matter(manifest, figures["rows"]),
        f"# {name}",
        "",
        f"{figures['rows']:,} rows of {manifest.row_tokens:,} tokens for supervised fine-tuning, "
        f"built by fixed-SFT from {origin} with the tokenizer and chat template of "
        f"{_origin(tok)}. Conversations are taken in a seeded permutation (seed "
        f"{manifest.seed}), rendered with the chat template, joined by EOS and cut into rows; rows "
        f"with no supervised token are skipped. `loss_mask` marks the {manifest.loss_mask} "
        "training targets: the assistant's answers and the stop tokens that end them.",
        "",
        f"**{outcome}**{': ' if unpinned else ' against '}"
        + (
            f"`manifests/{name}.yaml` (shipped with fixed-sft)"
            if is_shipped(manifest)
            else f"`{manifest.path}`"
        )
        + (" pins no figure of the rows (`expect`)." if unpinned else "."),
        "",
        "## Hashes",
        "",
        "| figure | expected | got | status |",
        "|---|---|---|---|",
        *[
            f"| {c['figure']} | {'' if c['expected'] is None else c['expected']} | "
            f"{_fmt(c['got'])} | {c['status']} |"
            for c in report["checks"]
        ],
        "",
        "`rows_sha256` names the rows themselves (token ids as little-endian uint32, then the mask "
        "as uint8, row by row); `segments_sha256` their conversations' boundaries "
        "(`metadata.segment_start`, data/ROWS.md); `parquet_sha256` names this file, whose bytes "
        "also depend on the writer's version.",
        "",
        "## Pinned inputs",
        "",
        "| input | repo | revision | sha256 |",
        "|---|---|---|---|",
        *[
            f"| dataset: `{f['name']}` ({f['bytes']:,} bytes) | {_repo_cells(f)} "
            f"| `{f['sha256']}`{_checked(f['checked_against'])} |"
            for f in report["source_files"]
        ],
        *[
            f"| `{file}` | {_repo_cells(tok.where())} | `{digest}` |"
            for file, digest in tok.sha256.items()
        ],
        "",
        "## Chat format",
        "",
        f"`loss_mask: {manifest.loss_mask}` (data/ROWS.md): "
        "the chat format's mask rule and its inputs.",
        "",
        "| field | value |",
        "|---|---|",
        *[f"| `{key}` | `{_fmt_value(value)}` |" for key, value in report["chat_format"].items()],
        "",
        "## Contract",
        "",
        "The readings of the row contract this build used (data/ROWS.md, "
        '"Readings the recipe card leaves open"):',
        "",
        "| key | reading | |",
        "|---|---|---|",
        *[
            f"| `{key}` | `{value}` | "
            f"{'' if key not in manifest.contract.deviations() else 'not the default'} |"
            for key, value in manifest.contract.as_dict().items()
        ],
        "",
        "## Contents",
        "",
        f"- supervised tokens: {figures['supervised_token_ratio']:.4f} of all tokens",
        f"- trained tokens: {figures['trained_token_ratio']:.4f} of all tokens (the supervised "
        "ones after each row's token 0, which a next-token loss cannot predict)",
        f"- source conversations consumed: {summary['conversations_consumed']:,} "
        f"({summary['stream_tokens_consumed']:,} tokens with their EOS; the last one may be cut)",
        f"- windows skipped for having no supervised token: {summary['windows_skipped']:,} (a "
        f"window is a row-length stretch of the stream: {manifest.row_tokens:,} tokens)",
        "- conversations that train nothing but the stop tokens that end their answers (every "
        f"answer empty): {summary['conversations_training_only_stop_tokens']:,}",
        f"- conversations with no supervised token at all (no answer, or none trained): "
        f"{summary['conversations_unsupervised']:,}",
        *(
            [
                "- conversations left out by the mask rule (no answer header found): "
                f"{summary['conversations_left_out']:,}"
            ]
            if summary["conversations_left_out"]
            else []
        ),
        *(
            [
                "- the stream's last tokens, less than a row, dropped (`rows: all`): "
                f"{summary['remainder_tokens_dropped']:,}"
            ]
            if "remainder_tokens_dropped" in summary
            else []
        ),
        f"- padding tokens: {figures['padding_tokens']}",
        f"- encoded by {engine['name']} {engine['version']}"
        + (
            f", {engine['conversations_cross_checked']:,} conversations also encoded by tokenizers "
            "(the reference), which agreed"
            if engine["name"] != "tokenizers"
            else " (the reference engine)"
        )
        + (f"; {engine['note']}" if engine["note"] else ""),
        f"- encoded in {_workers(report)} (`--workers {report['workers_requested']}`, "
        f"{report['cores']} cores available; the rows are the same for any number)",
        f"- limits: a conversation up to {report['limits']['conversation_chars']:,} characters, "
        f"its render up to {report['limits']['render_chars']:,} (`limits:`; more is refused)",
        "",
        *_refused_table(report["refused_left_out"], manifest.leave_out_refused),
        *_datasets_table(manifest, summary),
        *_sources_table(summary, stats, name),
        *_tool_calls(manifest, summary),
        "### Conversation lengths (tokens, with EOS)",
        "",
        "| " + " | ".join(summary["conversation_tokens_percentiles"]) + " |",
        "|" + "---:|" * len(summary["conversation_tokens_percentiles"]),
        "| "
        + " | ".join(f"{v:,}" for v in summary["conversation_tokens_percentiles"].values())
        + " |",
        "",
        f"![conversation lengths]({name}.conversation-lengths.png)",
        "",
        "### Supervised fraction per row",
        "",
        f"![supervised fraction per row]({name}.row-supervision.png)",
        "",
        "## Columns",
        "",
        "`input_ids` (list<int32>), `loss_mask` (list<uint8>), and `metadata`: `row_index`, and "
        "for each conversation with tokens in the row its `source_index`, `source_id` and "
        "`segment_start` (where its segment starts: a trainer can keep the conversations apart, "
        "see docs/training.md).",
        "",
        "## Toolchain",
        "",
        "| package | version |",
        "|---|---|",
        *[f"| {package} | {version} |" for package, version in report["versions"].items()],
        "",
    ]
    return "\n".join(lines)


def _origin(pin, short: bool = False) -> str:
    """A pin in the card's words: a repo at its revision, or a local folder."""
    if pin.local:
        return f"the local folder `{pin.path}`"
    return f"`{pin.repo}` at `{pin.revision[:12] if short else pin.revision}`"


def _repo_cells(where: dict) -> str:
    """The repo and revision cells of an input, or its folder's."""
    if "path" in where:
        return f"`{where['path']}` | local folder"
    return f"`{where['repo']}` | `{where['revision']}`"


def _checked(against: str | None) -> str:
    if against is None:
        return ""
    return " (pinned by the manifest)" if against == PINNED_BY_MANIFEST else " (its LFS object id)"


def _fmt_value(value) -> str:
    """A chat-format value in a table cell.

    Text as it is, anything else as JSON.
    """
    return (
        value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    )


def _refused_table(refused: list[dict], bound: int) -> list[str]:
    """The refused conversations the build left out, where it left any."""
    if not refused:
        return []
    return [
        "### Conversations left out",
        "",
        f"The contract cannot encode these source conversations; `leave_out_refused: {bound}` "
        'left them out of the stream (data/ROWS.md, "Rows"):',
        "",
        "| source index | id | reason |",
        "|---:|---|---|",
        *[
            f"| {r['source_index']} | {_cell(str(r['id']))} | {_cell(r['reason'])} |"
            for r in refused
        ],
        "",
    ]


def _cell(text: str) -> str:
    """Text in a Markdown table cell: one line, no column bars."""
    return " ".join(text.split()).replace("|", "\\|")


def _datasets_table(manifest: Manifest, summary: dict) -> list[str]:
    """A mixture's datasets, with what each kept and gave to the rows."""
    if not manifest.mixture:
        return []
    return [
        "### Datasets",
        "",
        "| dataset | files | take | conversations | tokens | supervised tokens |",
        "|---|---|---:|---:|---:|---:|",
        *[
            f"| {_origin(pin, short=True)} | `{pin.pattern}` | {pin.take or 'all'} | "
            f"{d['conversations']:,} | {d['tokens']:,} | {d['supervised_tokens']:,} |"
            for pin, d in zip(manifest.datasets, summary["by_dataset"], strict=True)
        ],
        "",
    ]


def _tool_calls(manifest: Manifest, summary: dict) -> list[str]:
    """The "Tool calls" section: what the consumed conversations hold of tool use.

    Only where a dataset names a tools field (or leaves one unread) or a conversation uses tools.
    """
    tools = summary["tool_calls"]
    named = [pin for pin in manifest.datasets if pin.tools is not None or pin.tools_unused]
    if not named and not any(v for k, v in tools.items() if k != "tools_field_unread"):
        return []
    forms = [pin.arguments for pin in manifest.datasets]
    return [
        "### Tool calls",
        "",
        "| conversations with tools | with calls | calls | arguments stored as JSON strings "
        "| as objects | tool messages |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {tools['conversations_with_tools']:,} | {tools['conversations_with_calls']:,} "
        f"| {tools['calls']:,} | {tools['calls_string_arguments']:,} "
        f"| {tools['calls_object_arguments']:,} | {tools['tool_messages']:,} |",
        "",
        f"Arguments reach the template as `arguments: {'`, `'.join(dict.fromkeys(forms))}` says "
        '(data/ROWS.md, "Tool calls"): under `object` a JSON string is parsed, and the '
        "template prints the object again, re-spaced, its numbers as Python writes them.",
        *(
            [
                "",
                "A `tools` field is deliberately not read (`tools: null`) in: "
                + ", ".join(f"`{name}`" for name in tools["tools_field_unread"])
                + ".",
            ]
            if tools["tools_field_unread"]
            else []
        ),
        "",
    ]


def _sources_table(summary: dict, stats: BuildStats, name: str) -> list[str]:
    """The conversations consumed, grouped by the data's ``source`` field.

    Only where the data has one.
    """
    if not stats.has_source():
        return [
            "### Sources",
            "",
            "The data has no `source` field, so its conversations are not grouped by one.",
            "",
        ]
    return [
        "### Sources",
        "",
        "| source | conversations | tokens | supervised tokens | share of tokens |",
        "|---|---:|---:|---:|---:|",
        *[
            f"| {s['source']} | {s['conversations']:,} | {s['tokens']:,} | "
            f"{s['supervised_tokens']:,} | "
            f"{s['tokens'] / max(1, summary['stream_tokens_consumed']):.1%} |"
            for s in summary["by_source"]
        ],
        "",
        f"![tokens per source]({name}.tokens-per-source.png)",
        "",
    ]


def _fmt(value) -> str:
    return f"{value:.6f}" if isinstance(value, float) else str(value)


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.family": "DejaVu Sans", "font.size": 9, "svg.hashsalt": "fixed-sft"})
    return plt, plt.subplots(figsize=(7, 3.6), dpi=100)


def _png(plt, fig, ax, title: str, xlabel: str, ylabel: str = "", legend: str = "best") -> bytes:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(loc=legend)
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def _plot_sources(stats: BuildStats, manifest: Manifest) -> bytes:
    plt, (fig, ax) = _figure()
    rows = stats.by_source()[:20][::-1]
    names = [r["source"] if len(r["source"]) <= 48 else "…" + r["source"][-47:] for r in rows]
    total = max(1, sum(r["tokens"] for r in stats.by_source()))
    bars = ax.barh(names, [r["tokens"] for r in rows], color="#9ab", label="all tokens")
    ax.barh(names, [r["supervised_tokens"] for r in rows], color="#2a7", label="supervised")
    # every source is named with its share, however small its bar
    ax.bar_label(
        bars, labels=[f" {r['tokens']:,} ({r['tokens'] / total:.1%})" for r in rows], fontsize=8
    )
    ax.set_xlim(0, max(r["tokens"] for r in rows) * 1.35 if rows else 1)
    return _png(
        plt, fig, ax, f"{manifest.name}: tokens per source", "tokens consumed", legend="lower right"
    )


def _plot_lengths(stats: BuildStats, manifest: Manifest) -> bytes:
    plt, (fig, ax) = _figure()
    lengths = np.asarray(stats.conversation_tokens, dtype=np.int64)
    low = min(int(lengths.min()) if lengths.size else 1, manifest.row_tokens)
    high = max(int(lengths.max()) if lengths.size else 2, manifest.row_tokens) + 1
    bins = np.unique(np.geomspace(low, high, 40).astype(np.int64))
    ax.hist(lengths, bins=bins, color="#47a")
    ax.set_xscale("log")
    # the data's range (and the row length), no empty decades
    ax.set_xlim(low, high)
    ax.axvline(
        manifest.row_tokens,
        color="#c33",
        linestyle="--",
        label=f"row length {manifest.row_tokens:,}",
    )
    return _png(
        plt,
        fig,
        ax,
        f"{manifest.name}: conversation lengths ({lengths.size:,} conversations)",
        "tokens per conversation (log scale)",
        "conversations",
    )


def _plot_supervision(stats: BuildStats, manifest: Manifest) -> bytes:
    plt, (fig, ax) = _figure()
    fraction = np.asarray(stats.row_supervised, dtype=np.float64) / manifest.row_tokens
    ax.plot(np.arange(fraction.size), fraction, color="#2a7", linewidth=0.8)
    ax.axhline(
        fraction.mean() if fraction.size else 0,
        color="#555",
        linestyle="--",
        label=f"mean {fraction.mean() if fraction.size else 0:.3f}",
    )
    ax.set_ylim(0, 1.02)
    return _png(
        plt, fig, ax, f"{manifest.name}: supervised fraction per row", "row", "supervised fraction"
    )
