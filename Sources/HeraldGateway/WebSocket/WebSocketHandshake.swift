import HeraldCore
import HeraldCrypto

/// The opening handshake of `GET /v1/ws` (RFC 6455 section 4.2), which
/// Herald answers itself like any other request.
public enum WebSocketHandshake {
    public enum Outcome: Sendable {
        /// The `101 Switching Protocols` head: frames follow it.
        case upgrade([UInt8])
        case refuse(HTTPResponse)
    }

    /// nil for a request that asks for no upgrade (or not on `/v1/ws`): it
    /// is answered as any other request (`GET /v1/ws` then says it expects
    /// one).
    public static func answer(_ head: HTTPWire.Head) -> Outcome? {
        let r = head.request
        guard r.path == "/v1/ws", r.method == "GET",
              let upgrade = r.headers["upgrade"], upgrade.lowercased().split(separator: ",").contains(where: { $0.trimmingSpaces == "websocket" })
        else { return nil }
        // RFC 6455 4.2.1: HTTP/1.1 or later, with Host (which `HTTPWire`
        // requires of every HTTP/1.1 request).
        guard !head.http10 else { return .refuse(.error(.badRequest("a WebSocket handshake needs HTTP/1.1"))) }
        guard head.connectionUpgrade else { return .refuse(.error(.badRequest("a WebSocket handshake needs Connection: Upgrade"))) }
        guard r.headers["sec-websocket-version"].map({ Substring($0).trimmingSpaces }) == "13" else {
            // RFC 6455 4.4: the versions taken go back in this header.
            var refusal = HTTPResponse.error(.badRequest("WebSocket version 13 only"))
            refusal.headers.append(("Sec-WebSocket-Version", "13"))
            return .refuse(refusal)
        }
        guard let key = r.headers["sec-websocket-key"].map({ String(Substring($0).trimmingSpaces) }), isValidKey(key) else {
            return .refuse(.error(.badRequest("Sec-WebSocket-Key must be 16 bytes in base64")))
        }
        return .upgrade(Array("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: \(accept(key: key))\r\n\r\n".utf8))
    }

    static func isValidKey(_ key: String) -> Bool {
        Base64.decode(Substring(key))?.count == 16
    }

    /// `Sec-WebSocket-Accept` for a client's key.
    static func accept(key: String) -> String {
        let digest = SHA1.digest(Array((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8))
        return Base64.encode(digest)
    }
}
