"""The code behind scripts/review_stack.py (review stacks pr-N; docs/review-stacks.md).

One job a module, imported in this order (each only from those above it):

- `common`: ROOT, namespaces and defaults, `ReviewError`, names (pr-N, pr-N-deploy), times
- `config`: the review stack's config from the base stack's, and the stack files
- `handoff`: the deploy identity's hand-over (`Handoff`), sealed and opened with openssl
- `costs`: a stack file's cost figures with this checkout's cost model
- `checkout`: `copy_checkout`, a copy of a checkout as a PR's checkout holds it (no imports)
- `engine`: `Engine` (the Pulumi CLI or the stand-in), `StackInfo`, `choose_engine`
- `deploy`: the subcommands up, access-up, handoff, plan, config, costs, comment
- `teardown`: the subcommands destroy, access-destroy, list, sweep
- `cli`: the arguments, the subcommand table `COMMANDS` and `main`

It imports scripts/review_comment.py as `review_comment`: scripts/ must be on sys.path (the
entry point puts it there).
"""
