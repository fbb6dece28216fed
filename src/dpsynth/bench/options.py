"""The bench config's sections for the options reference (`dpsynth options bench`, docs/config.md)."""

from __future__ import annotations

from dpsynth.bench.grid import BenchConfig, Variant
from dpsynth.runs.options_reference import SectionReference, model_section


def bench_reference() -> list[SectionReference]:
    return [model_section("bench", BenchConfig, "A bench config's top-level keys (`bench`)"),
            model_section("bench.variants", Variant, "Each entry of a bench config's `variants:` (`bench.variants`)")]
