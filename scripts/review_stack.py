"""Review stacks: a Pulumi stack and Modal environment `pr-<N>` per labelled pull request.

    python scripts/review_stack.py up      --pr N --head-repo OWNER/REPO --base-repo OWNER/REPO
    python scripts/review_stack.py plan    --pr N            # the PR's code against dev
    python scripts/review_stack.py comment --pr N            # the PR comment (Markdown)
    python scripts/review_stack.py destroy --pr N
    python scripts/review_stack.py sweep   [--older-than-days N] [--dry-run | --list-only]
    python scripts/review_stack.py access-up | handoff | access-destroy --pr N ...  # admin
    python scripts/review_stack.py dev-export --out FILE   # base branch, dev's passphrase
    python scripts/review_stack.py list | config --pr N | costs
  common: [--engine auto|cli|standin] [--flow auto|access|default] [--project DIR]
          [--base-stack dev] [--out-dir DIR] [--budget-usd 20] [--handoff FILE]
          [--state-dir DIR] [--server-url URL]   (the last two: stand-in only)

Lifecycle, identities and knobs: docs/review-stacks.md. In short:
- Two flows. `access` (the default when access/ exists): the access project (access/, run
  with an Owner's or Manager's token) owns review environment pr-N, its budget, its gateway
  proxy token and ONE identity, `pr-N-deploy`, contributor in pr-N only (`access-up` writes
  `access/Pulumi.pr-N.yaml` and hands the two tokens over in a mode-0600 file, `--handoff`,
  optionally sealed with openssl for a CI artifact); the review stack then runs in managed
  mode (`modal-llm:managedByAccessStack`, the proxy token as the secret `proxyToken`) with the
  pr-N-deploy token only: the PR's code never runs with the admin token. `default`: the review
  stack owns its environment, budget and proxy token itself (one token does everything).
- `up` refuses a fork's PR with one line and exit 0 ("no review stack for forks"); else it
  writes `Pulumi.pr-N.yaml` from the checkout's `Pulumi.<base>.yaml` (`review_config`:
  environment `pr-N`, every service scaled to zero and capped at `--max-containers`, spend
  limit `--budget-usd` (default $20/month: Modal's budget for the environment, which stops its
  work when reached), no adopted environment, no protected caches, no secret of the base stack:
  the review stack gets its own proxy token and API keys), runs `pulumi up` with the engine and
  writes the stack's NON-secret outputs to `--out-dir` (`review-outputs.json`, `review.json`).
  With `--handoff FILE` it deploys with that hand-over (CI's deploy job); without it in the
  access flow it runs `access-up` first itself (needs an Owner's or Manager's token).
- Isolation (docs/review-stacks.md): `access-up`/`handoff --state-key-env REVIEW_STATE_KEY`
  put review stack pr-N's own passphrase, HMAC(REVIEW_STATE_KEY, pr-N), in its hand-over;
  `up`/`destroy --handoff` run the engine under it (the passphrase secrets provider), never
  under the caller's, and refuse a state whose pickled providers are not encrypted secrets.
  `dev-export` (base-branch code, dev's passphrase) writes a copy of dev's state with every
  secret replaced; `plan --base-copy FILE` (the PR's code) previews against it in a private
  backend, with no passphrase of dev.
- `plan` writes what the comment compares, to `--out-dir`: `preview.json` (`pulumi preview
  --json --stack dev` of this checkout's code), `dev-outputs.json` (dev's outputs, secrets
  `[secret]`) and `costs.json` (this checkout's cost model on its `Pulumi.dev.yaml`: the new
  idle and worst-case figures, which `pulumi preview --json` does not carry).
- `comment` renders those files with scripts/review_comment.py (pure, unit-tested).
- `destroy` destroys the review stack and removes it (`pulumi stack rm`; the stand-in's state
  file); in the access flow as pr-N-deploy, then the access stack (environment, budget, proxy
  token, service user) with the caller's token. With `--handoff` only the review stack
  (CI's teardown job; `access-destroy` is the admin job's half).
- `sweep` destroys every review stack whose last deploy is older than N days (`--open-prs`:
  and those whose PR is not open). Which stacks exist and when they were last deployed: the
  CLI's `pulumi stack ls --json` (`name`, `lastUpdate`) of the service and access projects;
  the stand-in: the `pr-*.json` / `access-pr-*.json` state files in `--state-dir` and the
  `updated_at` each `up` records beside them (`pr-N.review.json`). A PR's age is that of the
  later of its two stacks; a stack being updated is left alone.

Engine, as scripts/up.sh decides it: `PULUMI_ENGINE=cli|standin|auto` (or `--engine`); auto
takes the Pulumi CLI when `pulumi` is on PATH or in ~/.pulumi/bin, else the stand-in
(`python -m pulumi_standin`, emulator only), said in one line.

Where the code is: the package scripts/review/ (this file is only the entry point, and
re-exports the few names a test uses): common.py (names, errors, times), config.py (review_config,
stack files), handoff.py (Handoff, seal/open), costs.py (stack_costs), engine.py (Engine,
choose_engine), deploy.py (up, access-up, handoff, plan, config, costs, comment), teardown.py
(destroy, access-destroy, list, sweep), cli.py (parse_args, COMMANDS, main). To monkeypatch a
name, patch it in the module that looks it up (e.g. review.engine.pulumi_cli), not here.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # this checkout's code (the PR's), never another tree's
    sys.path.insert(0, str(_ROOT))
if str(_ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(_ROOT / "scripts"))

# main, and what tests/ci/test_review_workflow.py uses through this file (the rest: review.*).
from review.cli import main  # noqa: E402
from review.common import ReviewError  # noqa: E402
from review.handoff import Handoff, read_handoff, write_handoff  # noqa: E402

__all__ = ["Handoff", "ReviewError", "main", "read_handoff", "write_handoff"]

if __name__ == "__main__":
    sys.exit(main())
