"""`dpsynth budget` prints the numbers the issue and PRIVACY.md give."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _budget(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "dpsynth", "budget", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_wasp_sigma_for_target() -> None:
    out = _budget("wasp", "--epsilon", "4", "--delta", "1e-5", "--iterations", "5", "--q", "8")
    assert "4 noisy releases: wasp.votes x4" in out
    assert "vote_sigma: 3.531" in out and "sensitivity 1.63298 [calibrated]" in out
    assert "paper's vote_sigma: 9.690" in out and "true epsilon at the paper's value: 1.287" in out


def test_wasp_epsilon_of_paper_sigma() -> None:
    out = _budget("wasp", "--sigma", "9.69", "--delta", "1e-5", "--iterations", "5", "--q", "8")
    assert "epsilon spent: 1.2867" in out  # PRIVACY.md: 1.287
    assert "vote_sigma: 9.6900 on 4 release(s), sensitivity 1.63298 [given: --sigma]" in out  # not "calibrated"


@pytest.mark.parametrize("args, others", [
    (("dpga",), "labels_scale, lengths_scale, keywords_scale, svt_scale"),
    (("wasp", "--resample-share", "0.2"), "resample_sigma"),
    (("fedgen", "--parties", "5"), "vote_sigma, label_sigma"),
])
def test_sigma_is_refused_where_other_knobs_are_sized_from_epsilon(args: tuple[str, ...], others: str) -> None:
    """--sigma sets one knob; the others (shares of epsilon, a second calibrated knob) had nothing to be sized
    from: they printed as 0, and the epsilon as inf beside an RDP figure of the other releases alone."""
    done = subprocess.run([sys.executable, "-m", "dpsynth", "budget", *args, "--sigma", "5"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and f"also sizes {others} from epsilon" in done.stderr
    assert "epsilon spent" not in done.stdout
    # a fixed second noise is fine: every knob has a value
    assert "epsilon spent: 3.0674" in _budget("wasp", "--sigma", "5", "--resample-sigma", "3")


def test_augpe() -> None:
    out = _budget("augpe", "--epsilon", "1", "--delta", "1e-5", "--iterations", "11")
    assert "10 noisy releases" in out and "vote_sigma: 11.797" in out


def test_dp_label_histogram_is_planned_and_leaves_less_for_the_votes() -> None:
    out = _budget("augpe", "--epsilon", "1", "--delta", "1e-5", "--iterations", "11", "--label-proportions", "dp")
    assert "labels.histogram x1, augpe.votes x10" in out
    assert "label_sigma: 10.0000 on 1 release(s)" in out and "vote_sigma: 12.71" in out
    assert "epsilon spent: 1.000" in out


def test_budget_of_a_whole_run_config(tmp_path) -> None:
    (tmp_path / "run.yaml").write_text(
        "data: {corpus: rotten_tomatoes, m: 100}\ngenerators: [{model: smollm2-135m-instruct}]\n"
        "wasp: {iterations: 5, q: 8}\nprivacy: {epsilon: 4, delta: 1.0e-5}\n"
        "federated: {parties: 10}\n")
    out = _budget("--config", str(tmp_path / "run.yaml"))
    assert "vote_sigma: 3.531" in out and "SecAgg+ clipping reserve 1e-08" in out and "epsilon spent: 3.99" in out


def test_budget_with_a_config_refuses_the_options_it_would_ignore(tmp_path) -> None:
    """Before: `budget wasp --config zero_shot.yaml` and `--q 5 -T 4 --parties 3` beside --config printed the
    config's plan as if they had been applied."""
    (tmp_path / "run.yaml").write_text(
        "data: {corpus: rotten_tomatoes, m: 100}\ngenerators: [{model: smollm2-135m-instruct}]\n"
        "wasp: {iterations: 5, q: 8}\nprivacy: {epsilon: 4, delta: 1.0e-5}\n")
    for args, named in ((["wasp"], "METHOD"), (["--q", "5", "-T", "4", "--parties", "3"],
                                               "--q, --iterations, --parties"),
                        (["--epsilon", "3"], "--epsilon"), (["--relabel-share", "0.5"], "--relabel-share")):
        done = subprocess.run([sys.executable, "-m", "dpsynth", "budget", *args, "--config", str(tmp_path / "run.yaml")],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and f"drop {named}" in done.stderr, done.stderr


@pytest.mark.parametrize("parties,expected", [("5", "3.16"), ("10", "4.71")])
def test_federated_single_party_view(parties: str, expected: str) -> None:
    out = _budget("wasp", "--sigma", "9.69", "--iterations", "5", "--parties", parties)
    assert f"gets epsilon {expected}" in out


def test_user_level() -> None:
    """Each person's votes are clipped to one record's norm: the sensitivity is one record's (1.63298), not 8x."""
    out = _budget("wasp", "--epsilon", "4", "--iterations", "5", "--max-records-per-user", "8")
    assert "1.63298" in out and "13.06385" not in out and "person (<= 8 records)" in out


def test_person_level_budget_plans_both_final_stages() -> None:
    """Planned without a config, a person-level run with `relabel:` and `resample:` (refused before: the planning
    task had one label, which relabel: refuses); both have one record's sensitivity (1 under add/remove), not k:
    each person's histogram votes and summed embeddings are clipped to one record's norm."""
    out = _budget("zero-shot", "--epsilon", "4", "--relabel-share", "0.2", "--resample-share", "0.5",
                  "--max-records-per-user", "3")
    assert "resample.histogram x1, relabel.centroids x1" in out and "person (<= 3 records)" in out
    assert "resample_sigma" in out and "relabel_sigma" in out
    assert out.count("sensitivity 1.00000") == 2 and "sensitivity 3.00000" not in out


def test_fedgen_budget_shows_each_group_and_what_each_party_adds() -> None:
    out = _budget("fedgen", "--epsilon", "4", "--parties", "10")
    assert "noise_multiplier: 1.7274" in out and "vote_sigma: 1.9567" in out and "label_sigma: 3.7310" in out
    assert "per group of records: parties:strong 3.99" in out and "parties:weak 3.99" in out
    assert "each party adds noise_multiplier 1.727, the full noise (local DP-SGD)" in out
    assert "each party adds vote_sigma 0.740" in out  # sigma / sqrt(7 weak parties)
