/// What lives on a raw socket: an HTTP connection, or the WebSocket it
/// became. lws accepts, runs TLS and reads; Herald frames and writes.
protocol RawConnection: AnyObject {
    func receive(_ data: UnsafeRawBufferPointer)
    /// The socket has room, or lws sent what it held for us. Non-zero closes.
    func writable() -> Int32
    func closed()
}

enum SocketWrite {
    case wrote(Int)
    /// The socket takes nothing now: wait until it is writable.
    case full
    case failed
}

/// All an HTTP connection does to its socket. `LWSSocket` is the lws raw
/// socket; the in-process tests give an in-memory one, and drive the
/// connection's deadlines with the gateway's clock.
protocol ConnectionSocket: AnyObject {
    /// Writes what the socket takes now, without waiting. Every byte taken
    /// is progress the caller sees (nothing is held out of its sight).
    func write(_ bytes: UnsafeRawBufferPointer) -> SocketWrite
    /// Asks for `writable()` once the socket has room.
    func wantWritable()
    /// Stops or resumes `receive`: stopped, input waits in the kernel and
    /// the client's TCP window closes.
    func setReading(_ on: Bool)
    /// Shuts our sending side: the client reads the end of the stream after
    /// the last answer, and may still send (which is read and dropped).
    func shutdownWrite()
    /// Closes after the current callback; `closed()` follows.
    func close()
    /// Gives the socket to a WebSocket: `handshake` is the `101` head it
    /// writes first, `early` the bytes read behind the upgrade request.
    func upgrade(handshake: [UInt8], origin: String?, early: [UInt8])
}
