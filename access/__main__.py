"""The access stack: per environment its Environment, budget, gateway proxy token and identities.

Run once per workspace by an Owner or Manager with their own Modal token (docs/program.md,
"Access: identities and the one-time bootstrap"). Each identity is a scoped `ServiceUser` with
an `EnvironmentRole` in its environment (`none`: no role at all). Outputs: `environments`
(plain ids and roles), `credentials` (secret: "<id>:<secret>" per token) and `next_steps` (the
commands that put each credential where it goes).
"""

from pathlib import Path

import pulumi

from components.config import ConfigError, access_next_steps, load_access_config
from components.modal.environment import Environment, EnvironmentArgs
from components.modal.environment_role import EnvironmentRole, EnvironmentRoleArgs
from components.modal.proxy_auth_token import ProxyAuthToken, ProxyAuthTokenArgs
from components.modal.service_user import ServiceUser, ServiceUserArgs
from components.modal.spend_alert import SpendAlert, SpendAlertArgs

stack_file = Path(__file__).with_name(f"Pulumi.{pulumi.get_stack()}.yaml")
try:
    environments = load_access_config(stack_file)
except ConfigError as exc:
    raise pulumi.RunError(f"invalid stack config: {exc}") from None


def pair(token_id: pulumi.Output[str], secret: pulumi.Output[str]) -> pulumi.Output[str]:
    return pulumi.Output.secret(pulumi.Output.concat(token_id, ":", secret))


plain: dict[str, object] = {}
credentials: dict[str, object] = {}
for env in environments:
    e = Environment(f"env-{env.name}", EnvironmentArgs(name=env.name, adopt=env.adopt))
    SpendAlert(
        f"budget-{env.name}",
        SpendAlertArgs(
            environment=e.name,
            monthly_budget_usd=env.monthly_budget_usd,
            thresholds=env.alert_thresholds,
        ),
    )
    token = ProxyAuthToken(
        f"gateway-token-{env.name}",
        ProxyAuthTokenArgs(
            name=f"{env.name}-gateway", environments=[e.name], rotation=env.proxy_token_rotation
        ),
    )
    users = {}
    for ident in env.identities:
        su = ServiceUser(
            f"su-{ident.name}",
            ServiceUserArgs(
                name=ident.name, rotation=ident.rotation, expires_in_days=ident.expires_in_days
            ),
        )
        if ident.role != "none":
            # The role follows the identity through rotations: every name it has (su.names).
            grant = EnvironmentRoleArgs(
                service_user=ident.name, environment=e.name, role=ident.role, service_users=su.names
            )
            EnvironmentRole(f"role-{ident.name}", grant)
        users[ident.name] = (su, ident.role)
    plain[env.name] = {
        "environment_id": e.environment_id,
        "proxy_token_id": token.token_id,
        "identities": {
            n: {"token_id": su.token_id, "role": role, "service_user": su.current_name}
            for n, (su, role) in users.items()
        },
    }
    credentials[env.name] = {
        "proxy_token": pair(token.token_id, token.token_secret),
        "identities": {n: pair(su.token_id, su.token_secret) for n, (su, _) in users.items()},
    }

pulumi.export("environments", plain)
pulumi.export("credentials", pulumi.Output.secret(credentials))
pulumi.export("next_steps", access_next_steps(environments, pulumi.get_stack()))
