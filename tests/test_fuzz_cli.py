"""Issue 17: hypothesis over every command's options (tests/cli_fuzz.py). Every call
exits 0, 1, 2 or 3; an error is one ``error:`` line and never a traceback nor a fault of
trainsim; JSON output has no NaN, infinity or negative time.

The default run makes a few hundred calls (derandomized, so CI sees the same ones);
``-m slow`` makes 10,000. ``benchmarks/fuzz_cli.py`` is the counted run of the issue
note (outcomes per command, slow calls).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from cli_fuzz import COMMANDS, SLOW_S, run
from malformed_corpus import build_corpus

#: Calls per command in the default run (the cheap commands get more).
DEFAULT_EXAMPLES = {"collective": 25, "simulate": 35, "failures": 25, "plan": 8,
                    "sweep": 15, "hardware": 20, "validate": 15}
#: Calls per command under -m slow: 10,000 in all.
SLOW_EXAMPLES = {"collective": 1500, "simulate": 2000, "failures": 1500, "plan": 1000,
                 "sweep": 1000, "hardware": 1000, "validate": 2000}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("fuzz"))


def _fuzz(command: str, corpus: dict[str, str], examples: int, *, derandomize: bool) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(COMMANDS[command](corpus))
    def call(args):
        outcome = run(args)
        assert not outcome.problems, (args, outcome.problems, outcome.err[-1500:])
        assert outcome.seconds < SLOW_S, (args, f"{outcome.seconds:.1f} s")

    call()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_survives_hostile_options(command, corpus):
    _fuzz(command, corpus, DEFAULT_EXAMPLES[command], derandomize=True)


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_survives_ten_thousand_calls(command, corpus):
    _fuzz(command, corpus, SLOW_EXAMPLES[command], derandomize=False)
