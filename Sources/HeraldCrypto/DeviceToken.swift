import HeraldCore

/// What a verified token's signature rests on: the `kid` its header named
/// and the secret that matched. A connection keeps it, so that a reload can
/// tell whether its token would still verify.
public struct TokenSignature: Sendable, Equatable {
    let kid: String?
    let secret: String

    /// Whether the token verifies with `secrets` (an app's after a reload;
    /// none for an app that is gone).
    public func holds(with secrets: [TokenSecret]) -> Bool {
        DeviceToken.candidates(kid: kid, in: secrets).contains { $0.secret == secret }
    }
}

/// HS256 JWTs for devices. Nothing but HS256 is accepted.
public enum DeviceToken {
    public static let leewaySeconds: Int64 = 30

    public static func sign(_ c: DeviceClaims, secret: String, kid: String? = nil) -> String {
        var h: JSONObject = ["alg": "HS256", "typ": "JWT"]
        if let kid { h["kid"] = .string(kid) }
        var o = JSONObject()
        o["app"] = .string(c.app)
        o["sub"] = .string(c.user)
        if let d = c.device { o["dev"] = .string(d) }
        o["iat"] = .int(c.issuedAt)
        if let nbf = c.notBefore { o["nbf"] = .int(nbf) }
        o["exp"] = .int(c.expiresAt)
        let signingInput = Base64URL.encode(JSON.object(h).encoded) + "." + Base64URL.encode(JSON.object(o).encoded)
        let sig = HMACSHA256.mac(key: Array(secret.utf8), message: Array(signingInput.utf8))
        return signingInput + "." + Base64URL.encode(sig)
    }

    public enum Failure: Error, Sendable, Equatable {
        /// Malformed, forged, wrong algorithm, unknown app or key id, expired, not yet valid.
        case invalid(String)
    }

    public struct Verified: Sendable, Equatable {
        public let claims: DeviceClaims
        public let signature: TokenSignature
    }

    /// The secrets a token is checked against: with a `kid` in its header,
    /// the secret of that kid, or a secret that has none (the single-secret
    /// form ignores kids, as it did before rotation); without, every secret.
    static func candidates(kid: String?, in secrets: [TokenSecret]) -> [TokenSecret] {
        guard let kid else { return secrets }
        return secrets.filter { $0.kid == nil || $0.kid == kid }
    }

    /// Verifies `token` with the secrets of the app it names; `secretsFor`
    /// answers nil for an unknown app.
    public static func verify(_ token: String, now: Millis, secretsFor: (String) -> [TokenSecret]?) -> Result<Verified, Failure> {
        guard token.utf8.count <= 8192 else { return .failure(.invalid("token too long")) }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3,
              let headerBytes = Base64URL.decode(parts[0]),
              let payloadBytes = Base64URL.decode(parts[1]),
              let sig = Base64URL.decode(parts[2]),
              let h = try? JSONParser.parse(headerBytes, maxDepth: 4).objectValue,
              let p = try? JSONParser.parse(payloadBytes, maxDepth: 4).objectValue
        else { return .failure(.invalid("malformed token")) }
        guard h["alg"]?.stringValue == "HS256" else { return .failure(.invalid("only HS256 tokens are accepted")) }
        if let typ = h["typ"], typ.stringValue != "JWT" { return .failure(.invalid("unexpected token type")) }
        var kid: String? = nil
        if let k = h["kid"], !k.isNull {
            guard let s = k.stringValue else { return .failure(.invalid("bad kid header")) }
            kid = s
        }
        guard let app = p["app"]?.stringValue, let secrets = secretsFor(app) else {
            return .failure(.invalid("token names no known app"))
        }
        let candidates = candidates(kid: kid, in: secrets)
        guard !candidates.isEmpty else { return .failure(.invalid("token names an unknown key id (kid)")) }
        let signingInput = Array(token.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        guard let signer = candidates.first(where: {
            constantTimeEquals(HMACSHA256.mac(key: Array($0.secret.utf8), message: signingInput), sig)
        }) else {
            return .failure(.invalid("bad token signature"))
        }
        guard let sub = p["sub"]?.stringValue, Identifiers.isUserId(sub) else { return .failure(.invalid("bad sub claim")) }
        // Times are seconds from 1970 to 9999: anything else is refused before
        // it is ever turned into milliseconds (where it could overflow).
        let times: ClosedRange<Int64> = 0...253_402_300_799
        guard let exp = p["exp"]?.int64Value, let iat = p["iat"]?.int64Value, times.contains(exp), times.contains(iat) else {
            return .failure(.invalid("token needs integer exp and iat claims between 1970 and 9999"))
        }
        var dev: String? = nil
        if let d = p["dev"], !d.isNull {
            guard let s = d.stringValue, Identifiers.isUserId(s) else { return .failure(.invalid("bad dev claim")) }
            dev = s
        }
        var nbf: Int64? = nil
        if let n = p["nbf"], !n.isNull {
            guard let v = n.int64Value, times.contains(v) else { return .failure(.invalid("bad nbf claim")) }
            nbf = v
        }
        let nowS = now.floorDiv(1000)
        guard now < exp * 1000 else { return .failure(.invalid("token expired")) }
        guard iat <= nowS + leewaySeconds else { return .failure(.invalid("token issued in the future")) }
        if let nbf, nbf > nowS + leewaySeconds { return .failure(.invalid("token not yet valid")) }
        return .success(Verified(claims: DeviceClaims(app: app, user: sub, device: dev, issuedAt: iat, expiresAt: exp, notBefore: nbf),
                                 signature: TokenSignature(kid: kid, secret: signer.secret)))
    }
}
