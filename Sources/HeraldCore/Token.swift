import CCrypto

/// HMAC-SHA256 through OpenSSL's libcrypto.
public enum HMACSHA256 {
    public static func mac(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var len: UInt32 = 32
        _ = key.withUnsafeBufferPointer { k in
            message.withUnsafeBufferPointer { m in
                out.withUnsafeMutableBufferPointer { o in
                    HMAC(EVP_sha256(), k.baseAddress, Int32(k.count), m.baseAddress, m.count, o.baseAddress, &len)
                }
            }
        }
        return out
    }
}

/// Comparison whose time depends only on the lengths, not the contents.
public func constantTimeEquals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    guard a.count == b.count else { return false }
    return a.withUnsafeBufferPointer { x in
        b.withUnsafeBufferPointer { y in CRYPTO_memcmp(x.baseAddress, y.baseAddress, x.count) == 0 }
    }
}

public enum Base64URL {
    static let table: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    public static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i + 3 <= bytes.count {
            let v = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            for s in [18, 12, 6, 0] { out.append(table[Int((v >> UInt32(s)) & 63)]) }
            i += 3
        }
        let rest = bytes.count - i
        if rest == 1 {
            let v = UInt32(bytes[i]) << 16
            out.append(table[Int(v >> 18 & 63)]); out.append(table[Int(v >> 12 & 63)])
        } else if rest == 2 {
            let v = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8
            out.append(table[Int(v >> 18 & 63)]); out.append(table[Int(v >> 12 & 63)]); out.append(table[Int(v >> 6 & 63)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Strict: unpadded alphabet only, and no stray bits in the last digit.
    public static func decode(_ s: Substring) -> [UInt8]? {
        var out: [UInt8] = []
        var acc: UInt32 = 0
        var bits = 0
        for c in s.utf8 {
            let d: UInt32
            switch c {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): d = UInt32(c - 65)
            case UInt8(ascii: "a")...UInt8(ascii: "z"): d = UInt32(c - 97 + 26)
            case UInt8(ascii: "0")...UInt8(ascii: "9"): d = UInt32(c - 48 + 52)
            case UInt8(ascii: "-"): d = 62
            case UInt8(ascii: "_"): d = 63
            default: return nil
            }
            acc = (acc << 6) | d
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8((acc >> UInt32(bits)) & 0xFF))
            }
        }
        if bits >= 6 || (acc & ((1 << UInt32(bits)) - 1)) != 0 { return nil }
        return out
    }
}

/// The claims of a device token (SPEC section 2).
public struct DeviceClaims: Sendable, Equatable {
    public let app: String
    public let user: String
    public let device: String?
    public let issuedAt: Int64
    public let expiresAt: Int64
    public let notBefore: Int64?

    public init(app: String, user: String, device: String?, issuedAt: Int64, expiresAt: Int64, notBefore: Int64? = nil) {
        self.app = app; self.user = user; self.device = device
        self.issuedAt = issuedAt; self.expiresAt = expiresAt; self.notBefore = notBefore
    }
    public var userKey: UserKey { UserKey(app: app, user: user) }
}

/// One of an app's token secrets. `kid` names it in the header of the
/// tokens it signs; the single-secret form (`tokenSecret`) has none.
public struct TokenSecret: Sendable, Equatable {
    public let kid: String?
    public let secret: String
    public init(kid: String? = nil, secret: String) { self.kid = kid; self.secret = secret }
}

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
