"""Modal apps the stack deploys beside the serving apps (container code: no components/, no
pulumi). `spend_alerts`: the per-environment spend watcher."""
