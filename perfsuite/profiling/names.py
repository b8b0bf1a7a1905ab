"""Row names as the attribution diff matches them across two profiles.

The same GPU kernel is named differently by two builds of a library: C++
template arguments and parameter lists (``void at::native::
vectorized_elementwise_kernel<4, ...>(int, ...)``), cuDNN's engine suffix
(``..._execute_kernel__5x_cudnn``), hashes (``_0x3f2a...``), Triton's
generated index and signature (``triton_poi_fused_add_relu_0``,
``triton__0d1d2de``) and launch-bound suffixes (``_lb``, ``__launch_bounds__``).
``match_key`` drops those parts and keeps what names the kernel: its
qualified function name, and for cutlass/cuDNN the tile and layout words,
which name a different kernel when they differ. Pure Python.
"""

from __future__ import annotations

import re

__all__ = ["match_key", "normalise_kernel", "strip_brackets"]

_HEX_HASH = re.compile(r"_(?:0x)?[0-9a-f]{12,}\b|_0x[0-9a-fA-F]+\b")
_CUDNN_ENGINE = re.compile(r"_*(?:execute_kernel)?_+\d+x_cudnn$|_+cudnn$")
_LAUNCH_BOUNDS = re.compile(r"(?:__launch_bounds__|_lb\d*|_launch_bounds(?:_\d+)*)$")
_TRITON = re.compile(r"^(triton_(?:[a-z]+_)?(?:fused_)?.*?)(?:_+\d+(?:d\d*|de)*)+$")
_TRITON_SIGNATURE = re.compile(r"^(triton_+)\d[\dde]*$")
_SPACES = re.compile(r"\s+")
_CUTLASS_WRAPPER = re.compile(r"^cutlass::Kernel\d*$")
# template arguments that are types or numbers, not the kernel's functor or tile
_PLAIN_ARGUMENT = re.compile(r"^(?:-?[\d.]+[uUlLfF]*|true|false|(?:unsigned |signed |const |long )*"
                             r"(?:float|double|int|long|short|char|bool|half|__half|__nv_bfloat16|"
                             r"c10::Half|c10::BFloat16|c10::complex|int\d+_t|uint\d+_t|size_t)\W*)$")


def strip_brackets(name: str, open_: str = "<", close: str = ">") -> str:
    """``name`` without its bracketed parts (nested ones included); an
    unbalanced bracket (a name cut short by the profiler) ends the name."""
    out, depth = [], 0
    for char in name:
        if char == open_:
            depth += 1
        elif char == close and depth:
            depth -= 1
        elif not depth:
            out.append(char)
    return "".join(out)


def _template_arguments(text: str) -> list[str]:
    """The top-level arguments of the first ``<...>`` of ``text``."""
    start = text.find("<")
    if start < 0:
        return []
    args, depth, current = [], 0, []
    for char in text[start + 1:]:
        if char == "<" or char == "(":
            depth += 1
        elif (char == ">" or char == ")") and depth:
            depth -= 1
        elif char == ">":
            break
        elif char == "," and not depth:
            args.append("".join(current))
            current = []
            continue
        current.append(char)
    return [*args, "".join(current)]


def _named_argument(text: str) -> str | None:
    """The first template argument that names something (a functor, a
    cutlass kernel), without its own arguments: it tells apart kernels that
    share a generic wrapper (``elementwise_kernel``, ``cutlass::Kernel``)."""
    for arg in _template_arguments(text):
        bare = strip_brackets(strip_brackets(strip_brackets(arg, "(", ")"), "{", "}")).strip().rstrip(":")
        if bare and not _PLAIN_ARGUMENT.match(bare):
            return _HEX_HASH.sub("", bare)
    return None


def normalise_kernel(name: str) -> str:
    """A kernel's name without what only a library's build changes."""
    text = _SPACES.sub(" ", name.strip()).replace("(anonymous namespace)::", "")
    if text.startswith("void "):
        text = text[5:]
    text = strip_brackets(text, "(", ")") if text.find("(") < text.find("<") or "<" not in text else text
    named = _named_argument(text)
    text = strip_brackets(strip_brackets(text), "(", ")")
    if " " in text:  # a return type left before the name
        text = text.rsplit(" ", 1)[-1]
    text = _HEX_HASH.sub("", text)
    if text.startswith("triton"):
        signature = _TRITON_SIGNATURE.match(text)
        if signature:
            return signature.group(1).rstrip("_") or text
        triton = _TRITON.match(text)
        return triton.group(1) if triton else text
    previous = None
    while previous != text:  # suffixes can stack: ..._lb__5x_cudnn
        previous = text
        text = _LAUNCH_BOUNDS.sub("", _CUDNN_ENGINE.sub("", text)).rstrip("_")
    if _CUTLASS_WRAPPER.match(text):
        text = "cutlass::Kernel"
    if named:
        return f"{text}<{named}>"
    return text or name.strip()


def match_key(category: str, name: str) -> str:
    """The name rows of ``category`` are matched by across two profiles."""
    if category == "kernel":
        return normalise_kernel(name)
    return name.strip()
