import HeraldCore

/// Compact JWS (RFC 7515), as JWTs use it: base64url(header).base64url(claims).base64url(signature).
public enum JWS {
    /// `alg` in the header is set to ES256, so header and signature cannot disagree.
    public static func sign(header: JSONObject, claims: JSONObject, es256 key: ES256Key) -> String {
        sign(header: header, alg: "ES256", claims: claims, signer: key.sign)
    }

    /// `alg` in the header is set to RS256.
    public static func sign(header: JSONObject, claims: JSONObject, rs256 key: RS256Key) -> String {
        sign(header: header, alg: "RS256", claims: claims, signer: key.sign)
    }

    private static func sign(header: JSONObject, alg: String, claims: JSONObject, signer: ([UInt8]) -> [UInt8]) -> String {
        var header = header
        header["alg"] = .string(alg)
        let input = Base64URL.encode(JSON.object(header).encoded) + "." + Base64URL.encode(JSON.object(claims).encoded)
        return input + "." + Base64URL.encode(signer(Array(input.utf8)))
    }
}
