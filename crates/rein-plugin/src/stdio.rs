//! Captured, capped stdout/stderr for guests.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// An output stream that keeps the last `cap` bytes written and never fails a write, so a
/// chatty guest can neither fill host memory nor crash on a full pipe.
#[derive(Clone)]
pub(crate) struct CappedPipe {
    inner: Arc<Mutex<Tail>>,
}

struct Tail {
    bytes: Vec<u8>,
    cap: usize,
    dropped: u64,
}

impl CappedPipe {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Tail {
                bytes: Vec::new(),
                cap,
                dropped: 0,
            })),
        }
    }

    fn push(&self, data: &[u8]) {
        let mut tail = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        tail.bytes.extend_from_slice(data);
        // Trim lazily, at twice the cap, so each byte is moved at most once on average.
        if tail.bytes.len() > 2 * tail.cap.max(1) {
            let excess = tail.bytes.len() - tail.cap;
            tail.bytes.drain(..excess);
            tail.dropped += excess as u64;
        }
    }

    /// The last bytes written (lossy UTF-8), prefixed with a marker if earlier output was
    /// dropped.
    pub(crate) fn tail(&self) -> String {
        let tail = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let start = tail.bytes.len().saturating_sub(tail.cap);
        let dropped = tail.dropped + start as u64;
        let text = String::from_utf8_lossy(&tail.bytes[start..]);
        let text = text.trim_end();
        if dropped > 0 {
            format!("[{dropped} earlier bytes dropped] {text}")
        } else {
            text.to_string()
        }
    }

    /// Forgets everything written so far.
    pub(crate) fn clear(&self) {
        let mut tail = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        tail.bytes.clear();
        tail.dropped = 0;
    }
}

impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for CappedPipe {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_bytes_and_counts_the_rest() {
        let pipe = CappedPipe::new(4);
        for chunk in ["hello ", "wor", "ld"] {
            pipe.push(chunk.as_bytes());
        }
        assert_eq!(pipe.tail(), "[7 earlier bytes dropped] orld");
        pipe.clear();
        pipe.push(b"ok\n");
        assert_eq!(pipe.tail(), "ok");
    }
}
