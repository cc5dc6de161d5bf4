import CCrypto

/// Why a key could not be loaded or a message not encrypted. The message
/// never holds key material.
public struct PushCryptoError: Error, Sendable, Equatable, CustomStringConvertible {
    public let message: String
    public var description: String { message }

    /// Also empties libcrypto's per-thread error queue: a failure left there
    /// would be read by the next TLS call on this thread (libcurl's,
    /// libwebsockets') as its own.
    init(_ message: String) {
        ERR_clear_error()
        self.message = message
    }
}
