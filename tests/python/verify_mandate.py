"""Verify a paygate mandate the way a third party would: from the gateway's published JWKS alone,
with PyJWT (pinned in requirements.txt), no paygate code and no secret.

    verify_mandate.py <jwks_url> <jws>

Prints {"kid": ..., "claims": {...}} and exits 0 when the signature verifies under the JWKS key
named by the header's kid (alg EdDSA only) and the mandate has not expired; prints the reason on
stderr and exits 1 otherwise.
"""

import json
import sys

import jwt


def main() -> int:
    jwks_url, token = sys.argv[1], sys.argv[2]
    try:
        header = jwt.get_unverified_header(token)
        if header.get("typ") != "paygate-mandate+jwt":
            raise jwt.InvalidTokenError(f"typ {header.get('typ')!r} is not a paygate mandate")
        # The key comes from the JWKS by kid; the algorithm is pinned, never read from the token.
        key = jwt.PyJWKClient(jwks_url, cache_keys=False).get_signing_key_from_jwt(token)
        claims = jwt.decode(
            token,
            key.key,
            algorithms=["EdDSA"],
            options={"require": ["exp", "iat", "jti"], "verify_aud": False},
            issuer="paygate",
        )
    except jwt.PyJWTError as e:
        print(f"invalid: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"kid": header.get("kid"), "claims": claims}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
