#if canImport(Glibc)
import Glibc
#else
import Darwin
#endif
import Synchronization

/// Which thread owns some state: an engine's, a service loop's, a curl
/// client's. The owner claims it when it starts; the state's entry points
/// then check it, in release builds too, as swift-nio's
/// `preconditionInEventLoop` does: a forgotten hop stops the process naming
/// both threads instead of racing. The check is one atomic load and a
/// `pthread_self` compare, no lock; the message is built only on failure.
public final class ThreadOwner: Sendable {
    @usableFromInline let owner = Atomic<UInt>(0)
    @usableFromInline let name: String

    public init(_ name: String) { self.name = name }

    /// The calling thread owns the state from now on.
    public func claim() { owner.store(currentThreadID(), ordering: .releasing) }

    /// Whether the calling thread is the one that last claimed the state.
    @inlinable public var isCurrent: Bool { owner.load(ordering: .acquiring) == currentThreadID() }

    @inlinable @inline(__always)
    public func preconditionCurrent(file: StaticString = #fileID, line: UInt = #line) {
        if _slowPath(!isCurrent) { touchedOffThread(file: file, line: line) }
    }

    /// `fatalError`, not `preconditionFailure`: an optimized build drops the
    /// latter's message, and the message is the point.
    @usableFromInline @inline(never)
    func touchedOffThread(file: StaticString, line: UInt) -> Never {
        let id = String(currentThreadID(), radix: 16), ownerID = String(owner.load(ordering: .acquiring), radix: 16)
        fatalError("\(name) state touched on thread \(currentThreadName()) (0x\(id)); it belongs to thread 0x\(ownerID)",
                   file: file, line: line)
    }
}

/// The calling thread's identity, for ownership checks.
@inlinable public func currentThreadID() -> UInt {
    #if canImport(Glibc)
    UInt(pthread_self())
    #else
    UInt(bitPattern: pthread_self())
    #endif
}

/// The calling thread's name, as `nameCurrentThread` set it.
public func currentThreadName() -> String {
    var bytes = [UInt8](repeating: 0, count: 64)
    #if os(Linux)
    let fd = open("/proc/thread-self/comm", O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return "?" }
    let n = read(fd, &bytes, bytes.count)
    close(fd)
    bytes = Array(bytes.prefix(max(n, 0)))
    #else
    bytes.withUnsafeMutableBufferPointer { b in
        b.withMemoryRebound(to: CChar.self) { _ = pthread_getname_np(pthread_self(), $0.baseAddress!, $0.count) }
    }
    #endif
    return String(decoding: bytes.prefix { $0 != 0 && $0 != 10 }, as: UTF8.self)
}

/// Names the calling thread as `top -H`, `perf` and `/proc/PID/task/*/comm`
/// show it (at most 15 bytes). Foundation's `Thread.name` does not reach the
/// OS thread on Linux, and Glibc's module hides `pthread_setname_np`.
public func nameCurrentThread(_ name: String) {
    #if os(Linux)
    let fd = open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
    guard fd >= 0 else { return }
    let bytes = Array(name.utf8.prefix(15))
    _ = write(fd, bytes, bytes.count)
    close(fd)
    #else
    _ = pthread_setname_np(name)
    #endif
}
