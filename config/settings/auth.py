"""Who is asking: the client address behind proxies, login throttling, API tokens' default
lifetime, single sign-on (docs/deployment.md, "Behind a proxy", "Single sign-on")."""

from __future__ import annotations

from datetime import timedelta

import environ

from .environment import env

# How many reverse proxies in front of fairq append to X-Forwarded-For (0: none, the peer
# is the client). accounts.client_ip.client_ip() is the one reader, for rate limits,
# login throttling and audit records. Behind proxies their X-Forwarded-Proto is trusted.
FAIRQ_TRUSTED_PROXY_COUNT = env.int("FAIRQ_TRUSTED_PROXY_COUNT", default=0)
if not 0 <= FAIRQ_TRUSTED_PROXY_COUNT <= 10:
    raise environ.ImproperlyConfigured("FAIRQ_TRUSTED_PROXY_COUNT must be 0..10")
if FAIRQ_TRUSTED_PROXY_COUNT:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# django-axes: a username is locked out at one client address after this many failed
# logins (web and admin), for this long; a success resets the count. Attempts are rows in
# the database (AccessAttempt, AccessLog: visible in the admin, shared by every process).
FAIRQ_LOGIN_FAILURE_LIMIT = env.int("FAIRQ_LOGIN_FAILURE_LIMIT", default=5)
FAIRQ_LOGIN_COOLOFF_MINUTES = env.int("FAIRQ_LOGIN_COOLOFF_MINUTES", default=15)
if FAIRQ_LOGIN_FAILURE_LIMIT < 1 or FAIRQ_LOGIN_COOLOFF_MINUTES < 1:
    raise environ.ImproperlyConfigured(
        "FAIRQ_LOGIN_FAILURE_LIMIT and FAIRQ_LOGIN_COOLOFF_MINUTES must be >= 1")
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = FAIRQ_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=FAIRQ_LOGIN_COOLOFF_MINUTES)
# Per username AND address: a guesser is stopped at their address without locking the
# real user out everywhere (which anyone could do by typing the username).
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "accounts.client_ip.client_ip"
AXES_LOCKOUT_CALLABLE = "accounts.backends.lockout_response"
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False

# The lifetime of an API token issued without one, in days (the team page's form and
# POST /tokens/ without `expires_in_days`); 0: such tokens never expire.
FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS = env.int("FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS", default=90)
if not 0 <= FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS <= 3650:
    raise environ.ImproperlyConfigured("FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS must be 0..3650")

# Single sign-on with OpenID Connect (accounts/sso.py; docs/deployment.md, "Single
# sign-on"): on when OIDC_RP_CLIENT_ID is set. The provider's endpoints are given
# explicitly (mozilla-django-oidc does no discovery).
OIDC_RP_CLIENT_ID = env("OIDC_RP_CLIENT_ID", default="")
OIDC_RP_CLIENT_SECRET = env("OIDC_RP_CLIENT_SECRET", default="")
OIDC_OP_AUTHORIZATION_ENDPOINT = env("OIDC_OP_AUTHORIZATION_ENDPOINT", default="")
OIDC_OP_TOKEN_ENDPOINT = env("OIDC_OP_TOKEN_ENDPOINT", default="")
OIDC_OP_USER_ENDPOINT = env("OIDC_OP_USER_ENDPOINT", default="")
OIDC_OP_JWKS_ENDPOINT = env("OIDC_OP_JWKS_ENDPOINT", default="")
OIDC_RP_SIGN_ALGO = env("OIDC_RP_SIGN_ALGO", default="RS256")
OIDC_RP_SCOPES = env("OIDC_RP_SCOPES", default="openid email profile")
# Match the ID token's `kid` header to a JWKS key. Off only for a provider that signs
# without a kid and publishes a single key.
OIDC_VERIFY_KID = env.bool("OIDC_VERIFY_KID", default=True)
# After a refused or failed sign-on: the login page, which says so.
LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/?sso=failed"
# The claims: the username (matched to accounts without a password), and the groups
# whose `<prefix><team slug>` make a member and `<prefix><team slug><admin suffix>` a
# team admin. Memberships are re-synced from the claim at every sign-on.
FAIRQ_OIDC_USERNAME_CLAIM = env("FAIRQ_OIDC_USERNAME_CLAIM", default="preferred_username")
FAIRQ_OIDC_GROUPS_CLAIM = env("FAIRQ_OIDC_GROUPS_CLAIM", default="groups")
FAIRQ_OIDC_TEAM_GROUP_PREFIX = env("FAIRQ_OIDC_TEAM_GROUP_PREFIX", default="")
FAIRQ_OIDC_ADMIN_GROUP_SUFFIX = env("FAIRQ_OIDC_ADMIN_GROUP_SUFFIX", default=":admin")
# The group that makes fairq staff (tiers, quotas, prices, every team). Empty: sign-on
# leaves staff rights alone (granted by hand). Set: re-synced at every sign-on, so leaving
# the group takes them away at the next login.
FAIRQ_OIDC_STAFF_GROUP = env("FAIRQ_OIDC_STAFF_GROUP", default="")
# Derived, not read: single sign-on is on when a client id is set.
FAIRQ_OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
if FAIRQ_OIDC_ENABLED:
    _missing = [n for n in ("OIDC_OP_AUTHORIZATION_ENDPOINT", "OIDC_OP_TOKEN_ENDPOINT",
                            "OIDC_OP_USER_ENDPOINT") if not globals()[n]]
    if OIDC_RP_SIGN_ALGO == "RS256" and not OIDC_OP_JWKS_ENDPOINT:
        _missing.append("OIDC_OP_JWKS_ENDPOINT")
    if _missing:
        raise environ.ImproperlyConfigured(
            f"OIDC_RP_CLIENT_ID is set, so single sign-on needs {', '.join(_missing)}")
