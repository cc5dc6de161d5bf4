#if canImport(Glibc)
import Glibc
#else
import Darwin
#endif

/// The calling thread's identity, for ownership checks.
@inlinable public func currentThreadID() -> UInt {
    #if canImport(Glibc)
    UInt(pthread_self())
    #else
    UInt(bitPattern: pthread_self())
    #endif
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
