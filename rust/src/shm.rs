//! System shared-memory regions that clients register by name (Triton's shared-memory
//! extension).
//!
//! A client creates a POSIX shared-memory object, writes tensors into it and registers
//! `(name, key, offset, byte_size)`. The server maps that window once, at registration, and
//! requests then name the region plus an offset and size inside it: input tensors are read in
//! place and outputs written in place, without crossing a socket.
//!
//! Safety of the mapping's lifetime: a [`Region`] owns its mapping and is shared as an
//! `Arc`. [`RegionRegistry::unregister`] only drops the registry's reference, so a request that
//! looked the region up earlier keeps the memory mapped until it lets go of its `Arc`.
//!
//! What stays the client's responsibility: the object must not be shrunk while registered
//! (touching a mapped page past the end of the object raises `SIGBUS`, which ends Triton).
//! Each access checks the object's size first and refuses a range it no longer backs; a
//! shrink between that check and the access, or while a model reads an input in place, still
//! raises `SIGBUS`. The client must not rewrite a region while a request reads or writes it.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Code, CoreError};

/// Keys Triton's Python backend uses for its own regions; clients may not register them.
pub const RESERVED_KEY_PREFIX: &str = "triton_python_backend_shm_region_";
/// Keys of the server's own segments (batches handed to workers and back, cancellation
/// flags): registering one would let a client read other requests' tensors.
pub const OWN_KEY_PREFIX: &str = "tritonfast-";
/// Longest name a POSIX shared-memory object may have on Linux (`NAME_MAX`).
const MAX_KEY_BYTES: usize = 255;

/// What `status` reports for one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    pub name: String,
    pub key: String,
    pub offset: u64,
    pub byte_size: u64,
}

/// The POSIX name to open for `key`, or why `key` is not one.
///
/// Only names of shared-memory objects are accepted: one optional leading `/` followed by a
/// non-empty name with no other `/` (so nothing outside the shared-memory file system can be
/// reached), not `.` or `..`, without NUL bytes, at most 255 bytes.
pub fn posix_name(key: &str) -> Result<CString, CoreError> {
    let bare = key.strip_prefix('/').unwrap_or(key);
    let problem = if bare.is_empty() {
        Some("it is empty")
    } else if bare.contains('/') {
        Some("only a leading '/' is allowed")
    } else if bare == "." || bare == ".." {
        Some("'.' and '..' are not object names")
    } else if bare.contains('\0') {
        Some("it contains a NUL byte")
    } else if bare.len() > MAX_KEY_BYTES {
        Some("it is longer than 255 bytes")
    } else {
        None
    };
    if let Some(problem) = problem {
        return Err(CoreError::invalid_arg(format!(
            "shared memory key '{key}' is not a POSIX shared memory object name: {problem}"
        )));
    }
    // Cannot fail: NUL bytes were ruled out above.
    CString::new(format!("/{bare}")).map_err(|_| CoreError::invalid_arg("NUL in key"))
}

/// A window of a shared-memory object mapped read-write into this process; unmapped on drop.
#[derive(Debug)]
struct Mapping {
    /// Where the mapping starts (page-aligned), or `None` for an empty window.
    base: Option<NonNull<libc::c_void>>,
    /// Bytes mapped from `base`.
    mapped: usize,
    /// Where the registered window starts within the mapping.
    skip: usize,
    /// The client's object, kept open to see whether it still backs the window (`None`: an
    /// object this process owns, which nobody else resizes).
    object: Option<Fd>,
}

// SAFETY: the mapping is plain shared memory owned by this value; no thread-affine state is
// involved, and all access goes through raw copies whose synchronisation the callers provide
// (a request uses its own byte ranges).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out the address, never a Rust reference to the bytes.
unsafe impl Sync for Mapping {}

/// Closes a file descriptor when dropped.
#[derive(Debug)]
struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: `self.0` is a descriptor this value opened and nothing else closes.
        unsafe { libc::close(self.0) };
    }
}

impl Mapping {
    /// Maps `byte_size` bytes of the object `name` starting at `offset`.
    fn open(region: &str, key: &str, offset: u64, byte_size: u64) -> Result<Self, CoreError> {
        let path = posix_name(key)?;
        // SAFETY: `path` is a valid NUL-terminated string; shm_open has no other preconditions.
        let fd = unsafe { libc::shm_open(path.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(CoreError::new(
                Code::Internal,
                format!("Unable to open shared memory region: '{key}'"),
            ));
        }
        let fd = Fd(fd);
        let mut mapping = Self::of(&fd, region, key, offset, byte_size)?;
        mapping.object = Some(fd);
        Ok(mapping)
    }

    /// The size of the client's object now, if it could have shrunk since it was mapped.
    fn object_size_now(&self) -> Option<u64> {
        self.object.as_ref().and_then(object_size)
    }

    /// The client's object's (device, inode), from the descriptor that was mapped.
    fn object_identity(&self) -> Option<(u64, u64)> {
        let stat = object_stat(self.object.as_ref()?)?;
        Some((stat.st_dev, stat.st_ino))
    }

    /// Maps `byte_size` bytes at `offset` of the open object `fd` (`key`, registered as
    /// `region`: names for error messages).
    fn of(
        fd: &Fd,
        region: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<Self, CoreError> {
        let object_size = object_size(fd).ok_or_else(|| {
            CoreError::new(
                Code::Internal,
                format!("Unable to read the size of shared memory region: '{key}'"),
            )
        })?;
        let invalid = || {
            CoreError::invalid_arg(format!(
                "failed to register shared memory region '{region}': invalid args"
            ))
        };
        let end = offset.checked_add(byte_size).ok_or_else(invalid)?;
        if end > object_size {
            return Err(invalid());
        }
        let len = usize::try_from(byte_size).map_err(|_| invalid())?;
        if len == 0 {
            return Ok(Self {
                base: None,
                mapped: 0,
                skip: 0,
                object: None,
            });
        }
        // mmap needs a page-aligned file offset; map from the page holding `offset`.
        let page = page_size();
        let skip = usize::try_from(offset % page).map_err(|_| invalid())?;
        let start = libc::off_t::try_from(offset - offset % page).map_err(|_| invalid())?;
        let mapped = skip.checked_add(len).ok_or_else(invalid)?;
        // SAFETY: a fresh shared read-write mapping of an open descriptor; the kernel checks
        // the arguments, and the result is checked for MAP_FAILED before any use.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.0,
                start,
            )
        };
        if address == libc::MAP_FAILED {
            let reason = std::io::Error::last_os_error();
            return Err(CoreError::invalid_arg(format!(
                "failed to register shared memory region '{region}': unable to process \
                 address space: {reason}"
            )));
        }
        Ok(Self {
            base: NonNull::new(address),
            mapped,
            skip,
            object: None,
        })
    }

    /// The first byte of the registered window (dangling but non-null when it is empty).
    fn start(&self) -> *mut u8 {
        match self.base {
            // SAFETY: `skip` < `mapped`, so the result stays inside the mapping.
            Some(base) => unsafe { base.as_ptr().cast::<u8>().add(self.skip) },
            None => NonNull::<u8>::dangling().as_ptr(),
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(base) = self.base {
            // SAFETY: `base`/`mapped` are exactly what mmap returned and were never unmapped;
            // no reference into the mapping outlives `self` (regions hand out addresses only to
            // holders of an `Arc<Region>`, which keeps `self` alive).
            unsafe { libc::munmap(base.as_ptr(), self.mapped) };
        }
    }
}

fn object_stat(fd: &Fd) -> Option<libc::stat> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `stat` is writable storage of the right type; fstat fills it on success.
    if unsafe { libc::fstat(fd.0, stat.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat returned 0, so it initialised `stat`.
    Some(unsafe { stat.assume_init() })
}

fn object_size(fd: &Fd) -> Option<u64> {
    u64::try_from(object_stat(fd)?.st_size).ok()
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096)
}

/// Where POSIX shared-memory objects are, for another process to open one by path.
pub const SHM_DIR: &str = "/dev/shm";

/// A shared-memory object this process creates, maps read-write, and unlinks when dropped:
/// memory another process can map by [`name`](OwnedSegment::name) and address by offset.
#[derive(Debug)]
pub struct OwnedSegment {
    name: String,
    mapping: Mapping,
    len: usize,
    /// Kept open: for the object's identity, and to reserve its memory ([`Self::reserve`]).
    fd: Fd,
}

impl OwnedSegment {
    /// Creates the object `name` (a POSIX name; it must not exist yet) of `len` bytes.
    ///
    /// # Errors
    /// `INVALID_ARG` for a bad name; `INTERNAL` when the system refuses (name taken, no space).
    pub fn create(name: &str, len: usize) -> Result<Self, CoreError> {
        let path = posix_name(name)?;
        let size = libc::off_t::try_from(len).map_err(|_| CoreError::invalid_arg("too large"))?;
        let failed = |what: &str| {
            let reason = std::io::Error::last_os_error();
            CoreError::internal(format!(
                "cannot {what} shared memory segment '{name}': {reason}"
            ))
        };
        // SAFETY: `path` is NUL-terminated; O_EXCL never opens an object someone else made.
        let fd = unsafe {
            libc::shm_open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )
        };
        if fd < 0 {
            return Err(failed("create"));
        }
        let fd = Fd(fd);
        let unlink = || {
            // SAFETY: `path` is NUL-terminated; removing the name we just created.
            unsafe { libc::shm_unlink(path.as_ptr()) };
        };
        // SAFETY: a descriptor we own; the kernel checks the size.
        if unsafe { libc::ftruncate(fd.0, size) } != 0 {
            let error = failed("size");
            unlink();
            return Err(error);
        }
        // Mapped through the descriptor just created: the name is not looked up again.
        let mapping = Mapping::of(&fd, name, name, 0, len as u64).inspect_err(|_| unlink())?;
        Ok(Self {
            name: path.to_string_lossy().into_owned(),
            mapping,
            len,
            fd,
        })
    }

    /// The object's (device, inode), by which another process that opens it by name checks
    /// that it is this object.
    pub fn identity(&self) -> Option<(u64, u64)> {
        let stat = object_stat(&self.fd)?;
        Some((stat.st_dev, stat.st_ino))
    }

    /// Takes the memory of the object's first `len` bytes now (`posix_fallocate`), so that
    /// writing them cannot fail later: a write to a page the file system has no room for
    /// raises SIGBUS, where this returns an error.
    ///
    /// # Errors
    /// `UNAVAILABLE` when the file system holding shared memory has no room for them.
    pub fn reserve(&self, len: usize) -> Result<(), CoreError> {
        let len = libc::off_t::try_from(len.min(self.len))
            .map_err(|_| CoreError::invalid_arg("too large"))?;
        // SAFETY: a descriptor this value owns; the kernel checks the range.
        let failed = unsafe { libc::posix_fallocate(self.fd.0, 0, len) };
        if failed != 0 {
            let reason = std::io::Error::from_raw_os_error(failed);
            return Err(CoreError::unavailable(format!(
                "no shared memory left for {len} bytes of '{}': {reason} (a container's \
                 --shm-size sets how much {SHM_DIR} holds)",
                self.name
            )));
        }
        Ok(())
    }

    /// The POSIX name other processes open (with its leading `/`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the object is in the file system (what a worker opens).
    pub fn path(&self) -> String {
        format!("{SHM_DIR}{}", self.name)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte; `len()` bytes from here are mapped while `self` lives.
    pub fn start(&self) -> *mut u8 {
        self.mapping.start()
    }
}

impl Drop for OwnedSegment {
    fn drop(&mut self) {
        if let Ok(path) = CString::new(self.name.clone()) {
            // SAFETY: a NUL-terminated name this value created; mappings elsewhere stay valid.
            unsafe { libc::shm_unlink(path.as_ptr()) };
        }
    }
}

/// A segment another process of the server created (a worker's outputs), mapped by name.
#[derive(Debug)]
pub struct AttachedSegment {
    name: String,
    mapping: Mapping,
    len: usize,
}

impl AttachedSegment {
    /// Maps the first `len` bytes of the object `name`.
    ///
    /// # Errors
    /// `INTERNAL` when it cannot be opened; `INVALID_ARG` when it is shorter than `len`.
    pub fn attach(name: &str, len: usize) -> Result<Self, CoreError> {
        let mut mapping = Mapping::open(name, name, 0, len as u64)?;
        // Its creator never shrinks it: no need to keep the object open to check its size.
        mapping.object = None;
        Ok(Self {
            name: name.to_owned(),
            mapping,
            len,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte; `len()` bytes from here are mapped while `self` lives.
    pub fn start(&self) -> *const u8 {
        self.mapping.start()
    }
}

/// One registered region: a mapped window of a client's shared-memory object.
#[derive(Debug)]
pub struct Region {
    info: RegionInfo,
    mapping: Mapping,
}

impl Region {
    /// Maps the window `[offset, offset + byte_size)` of the object `key` as region `name`.
    ///
    /// # Errors
    /// `INVALID_ARG` for a key that is not a POSIX object name, a reserved key, or a window
    /// beyond the object's end; `INTERNAL` when the object cannot be opened.
    pub fn open(name: &str, key: &str, offset: u64, byte_size: u64) -> Result<Self, CoreError> {
        let bare = key.trim_start_matches('/');
        for reserved in [RESERVED_KEY_PREFIX, OWN_KEY_PREFIX] {
            if bare.starts_with(reserved) {
                return Err(CoreError::invalid_arg(format!(
                    "cannot register shared memory region '{name}' with key '{key}' as the key \
                     contains the reserved prefix '{reserved}'"
                )));
            }
        }
        let mapping = Mapping::open(name, key, offset, byte_size)?;
        Ok(Self {
            info: RegionInfo {
                name: name.to_owned(),
                key: key.to_owned(),
                offset,
                byte_size,
            },
            mapping,
        })
    }

    pub fn info(&self) -> &RegionInfo {
        &self.info
    }

    /// The (device, inode) of the object that was mapped: another process that opens the key
    /// must find this very object there.
    pub fn object_identity(&self) -> Option<(u64, u64)> {
        self.mapping.object_identity()
    }

    pub fn byte_size(&self) -> u64 {
        self.info.byte_size
    }

    /// The address of `len` bytes at `offset` inside the region, checked as Triton checks.
    ///
    /// The address stays valid while this region is alive (hold its `Arc`).
    ///
    /// # Errors
    /// `INVALID_ARG` when the range does not lie inside the region.
    pub fn address(&self, offset: u64, len: u64) -> Result<*mut u8, CoreError> {
        let name = &self.info.name;
        let size = self.info.byte_size;
        if offset >= size && !(offset == 0 && len == 0) {
            return Err(CoreError::invalid_arg(format!(
                "Invalid offset for shared memory region: '{name}'"
            )));
        }
        let end = offset.checked_add(len).ok_or_else(|| {
            CoreError::invalid_arg(format!(
                "Integer overflow detected: byte_size ({len}) + offset ({offset}) exceeds \
                 maximum value ({}) for region '{name}'",
                u64::MAX
            ))
        })?;
        if end > size {
            return Err(CoreError::invalid_arg(format!(
                "Invalid offset + byte size for shared memory region: '{name}'"
            )));
        }
        // A client that shrank its object after registering would make this access raise
        // SIGBUS and end the server: refused instead. (It can still shrink it between this
        // check and the access, or while a model reads an input in place.)
        if let Some(now) = self.mapping.object_size_now() {
            let needed = self.info.offset.saturating_add(end);
            if now < needed {
                return Err(CoreError::invalid_arg(format!(
                    "shared memory region '{name}' was truncated by its owner to {now} bytes \
                     since it was registered: the {len} bytes at offset {offset} are no \
                     longer there (register it again)"
                )));
            }
        }
        // offset < byte_size, which was mapped, so it fits in usize.
        let offset = usize::try_from(offset).unwrap_or(usize::MAX);
        // SAFETY: offset + len <= len of the mapped window, checked above.
        Ok(unsafe { self.mapping.start().add(offset) })
    }

    /// Copies `bytes` into the region at `offset`.
    ///
    /// # Errors
    /// `INVALID_ARG` when they do not fit inside the region.
    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), CoreError> {
        let destination = self.address(offset, u64::try_from(bytes.len()).unwrap_or(u64::MAX))?;
        // SAFETY: `address` checked that `bytes.len()` bytes from `destination` lie inside the
        // mapping, which `self` keeps alive; a Rust slice cannot overlap the shared mapping
        // unless it was made from it, and `copy` (memmove) is correct even then.
        unsafe { std::ptr::copy(bytes.as_ptr(), destination, bytes.len()) };
        Ok(())
    }

    /// A copy of `len` bytes at `offset`.
    ///
    /// # Errors
    /// `INVALID_ARG` when the range does not lie inside the region.
    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, CoreError> {
        // Checked against the mapped length by `read_into`, so it fits in usize.
        let mut out = vec![0u8; usize::try_from(len).unwrap_or(0)];
        self.read_into(offset, &mut out)?;
        Ok(out)
    }

    /// Copies `destination.len()` bytes at `offset` into `destination`.
    ///
    /// # Errors
    /// `INVALID_ARG` when the range does not lie inside the region.
    pub fn read_into(&self, offset: u64, destination: &mut [u8]) -> Result<(), CoreError> {
        let len = destination.len();
        let source = self.address(offset, u64::try_from(len).unwrap_or(u64::MAX))?;
        // SAFETY: `address` checked the range; `destination` is a Rust slice of its own, which
        // cannot overlap the shared mapping (no slice of the mapping is ever made).
        unsafe { std::ptr::copy_nonoverlapping(source, destination.as_mut_ptr(), len) };
        Ok(())
    }
}

/// The server's registered regions, by name. Registration is rare; a request's look-up takes
/// the lock only to clone an `Arc`.
#[derive(Debug, Default)]
pub struct RegionRegistry {
    regions: Mutex<BTreeMap<String, Arc<Region>>>,
}

impl RegionRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps and registers a region.
    ///
    /// # Errors
    /// `ALREADY_EXISTS` when `name` is taken; the errors of [`Region::open`].
    pub fn register(
        &self,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<(), CoreError> {
        if self.regions.lock().contains_key(name) {
            return Err(already_registered(name));
        }
        // Map outside the lock: opening a region is a few system calls.
        let region = Arc::new(Region::open(name, key, offset, byte_size)?);
        let mut regions = self.regions.lock();
        if regions.contains_key(name) {
            return Err(already_registered(name));
        }
        regions.insert(name.to_owned(), region);
        Ok(())
    }

    /// Forgets region `name` (no error if there is none, as in Triton). Requests still using
    /// it keep it mapped until they finish.
    pub fn unregister(&self, name: &str) -> bool {
        self.regions.lock().remove(name).is_some()
    }

    /// Forgets every region; returns how many there were.
    pub fn unregister_all(&self) -> usize {
        let mut regions = self.regions.lock();
        let count = regions.len();
        regions.clear();
        count
    }

    /// The region called `name`.
    ///
    /// # Errors
    /// `NOT_FOUND` when no region has that name.
    pub fn get(&self, name: &str) -> Result<Arc<Region>, CoreError> {
        self.regions.lock().get(name).cloned().ok_or_else(|| {
            CoreError::new(
                Code::NotFound,
                format!("Unable to find shared memory region: '{name}'"),
            )
        })
    }

    /// Every region, by name; or just `name`.
    ///
    /// # Errors
    /// `NOT_FOUND` when `name` is given and not registered.
    pub fn status(&self, name: Option<&str>) -> Result<Vec<RegionInfo>, CoreError> {
        let regions = self.regions.lock();
        match name {
            None => Ok(regions.values().map(|r| r.info.clone()).collect()),
            Some(name) => regions
                .get(name)
                .map(|r| vec![r.info.clone()])
                .ok_or_else(|| {
                    CoreError::new(
                        Code::NotFound,
                        format!("Unable to find system shared memory region: '{name}'"),
                    )
                }),
        }
    }
}

fn already_registered(name: &str) -> CoreError {
    CoreError::new(
        Code::AlreadyExists,
        format!("shared memory region '{name}' already in manager"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A POSIX shared-memory object for one test, unlinked on drop.
    struct Object {
        key: String,
    }

    impl Object {
        fn new(tag: &str, size: usize, fill: u8) -> Self {
            let key = format!("/tfcore-test-{}-{tag}", std::process::id());
            let path = format!("/dev/shm{key}");
            std::fs::write(&path, vec![fill; size]).expect("create shm object");
            Self { key }
        }
    }

    impl Drop for Object {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(format!("/dev/shm{}", self.key));
        }
    }

    #[test]
    fn only_posix_object_names_are_keys() {
        assert_eq!(posix_name("/abc").unwrap().to_str().unwrap(), "/abc");
        assert_eq!(posix_name("abc").unwrap().to_str().unwrap(), "/abc");
        for bad in ["", "/", "/a/b", "../etc/passwd", "/..", ".", "a\0b", "//x"] {
            let err = posix_name(bad).unwrap_err();
            assert_eq!(err.code, Code::InvalidArg, "{bad:?}");
        }
        assert!(posix_name(&"x".repeat(255)).is_ok());
        assert!(posix_name(&"x".repeat(256)).is_err());
    }

    #[test]
    fn registers_reads_writes_and_unregisters() {
        let object = Object::new("rw", 10_000, 7);
        let registry = RegionRegistry::new();
        registry.register("r", &object.key, 4096, 100).unwrap();
        let region = registry.get("r").unwrap();
        assert_eq!(region.read(0, 3).unwrap(), [7, 7, 7]);
        region.write(98, &[1, 2]).unwrap();
        assert_eq!(region.read(97, 3).unwrap(), [7, 1, 2]);
        let on_disk = std::fs::read(format!("/dev/shm{}", object.key)).unwrap();
        assert_eq!(&on_disk[4096 + 97..4096 + 100], &[7, 1, 2]);
        assert_eq!(
            registry.status(None).unwrap(),
            vec![RegionInfo {
                name: "r".into(),
                key: object.key.clone(),
                offset: 4096,
                byte_size: 100
            }]
        );
        assert!(registry.unregister("r"));
        assert!(!registry.unregister("r"));
        assert_eq!(registry.get("r").unwrap_err().code, Code::NotFound);
        // The request that looked it up still has it mapped.
        assert_eq!(region.read(98, 2).unwrap(), [1, 2]);
    }

    #[test]
    fn a_region_its_owner_truncated_is_refused_instead_of_raising_sigbus() {
        let object = Object::new("shrunk", 3 * 4096, 5);
        let registry = RegionRegistry::new();
        registry.register("r", &object.key, 4096, 8192).unwrap();
        let region = registry.get("r").unwrap();
        assert_eq!(region.read(8000, 2).unwrap(), [5, 5]);
        std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/dev/shm{}", object.key))
            .unwrap()
            .set_len(4096 + 100)
            .unwrap();
        // Still backed: the first 100 bytes of the window.
        assert_eq!(region.read(98, 2).unwrap(), [5, 5]);
        // Past the new end: an error, where touching the page would raise SIGBUS.
        let error = region.read(8000, 2).unwrap_err();
        assert_eq!(error.code, Code::InvalidArg);
        assert!(
            error
                .message
                .contains("was truncated by its owner to 4196 bytes"),
            "{error:?}"
        );
        assert!(region.write(4000, &[1]).is_err());
    }

    #[test]
    fn offsets_need_not_be_page_aligned() {
        let object = Object::new("unaligned", 5000, 0);
        std::fs::write(
            format!("/dev/shm{}", object.key),
            (0..5000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
        )
        .unwrap();
        let registry = RegionRegistry::new();
        registry.register("u", &object.key, 4099, 10).unwrap();
        let expected: Vec<u8> = (4099..4109u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(registry.get("u").unwrap().read(0, 10).unwrap(), expected);
    }

    #[test]
    fn registration_errors() {
        let object = Object::new("errors", 64, 0);
        let registry = RegionRegistry::new();
        registry.register("a", &object.key, 0, 64).unwrap();
        let dup = registry.register("a", &object.key, 0, 8).unwrap_err();
        assert_eq!(dup.code, Code::AlreadyExists);
        assert_eq!(dup.message, "shared memory region 'a' already in manager");
        let beyond = registry.register("b", &object.key, 8, 64).unwrap_err();
        assert_eq!(
            beyond.message,
            "failed to register shared memory region 'b': invalid args"
        );
        let overflow = registry
            .register("b", &object.key, u64::MAX, 2)
            .unwrap_err();
        assert_eq!(overflow.code, Code::InvalidArg);
        let missing = registry
            .register("b", "/tfcore-test-no-such-object", 0, 8)
            .unwrap_err();
        assert_eq!(missing.code, Code::Internal);
        let path = registry
            .register("b", "/../../etc/passwd", 0, 8)
            .unwrap_err();
        assert_eq!(path.code, Code::InvalidArg);
        let reserved = registry
            .register("b", "/triton_python_backend_shm_region_1", 0, 8)
            .unwrap_err();
        assert_eq!(reserved.code, Code::InvalidArg);
        // The server's own segments (another request's batch, say) exist but are refused.
        let own = Object::new("own", 64, 0);
        let own_key = own.key.replacen("/tfcore-test-", "/tritonfast-in-", 1);
        std::fs::rename(format!("/dev/shm{}", own.key), format!("/dev/shm{own_key}")).unwrap();
        let refused = registry.register("b", &own_key, 0, 8).unwrap_err();
        std::fs::rename(format!("/dev/shm{own_key}"), format!("/dev/shm{}", own.key)).unwrap();
        assert_eq!(refused.code, Code::InvalidArg);
        assert!(refused.message.contains("reserved prefix 'tritonfast-'"));
        assert_eq!(registry.status(None).unwrap().len(), 1);
        assert_eq!(registry.status(Some("b")).unwrap_err().code, Code::NotFound);
    }

    #[test]
    fn accesses_are_bounds_checked() {
        let object = Object::new("bounds", 128, 0);
        let registry = RegionRegistry::new();
        registry.register("r", &object.key, 0, 128).unwrap();
        let region = registry.get("r").unwrap();
        assert!(region.address(0, 128).is_ok());
        assert!(region.address(127, 1).is_ok());
        let past = region.address(128, 1).unwrap_err();
        assert_eq!(past.message, "Invalid offset for shared memory region: 'r'");
        let long = region.address(100, 29).unwrap_err();
        assert_eq!(
            long.message,
            "Invalid offset + byte size for shared memory region: 'r'"
        );
        assert!(region.address(1, u64::MAX).is_err());
        assert!(region.write(120, &[0; 9]).is_err());
    }

    #[test]
    fn empty_windows_are_allowed() {
        let object = Object::new("empty", 16, 0);
        let registry = RegionRegistry::new();
        registry.register("e", &object.key, 16, 0).unwrap();
        let region = registry.get("e").unwrap();
        assert!(region.address(0, 0).is_ok());
        assert!(region.read(0, 1).is_err());
    }

    #[test]
    fn owned_segments_are_visible_by_name_and_removed_on_drop() {
        let name = format!("/tfcore-test-{}-owned", std::process::id());
        let segment = OwnedSegment::create(&name, 8192).unwrap();
        assert_eq!(segment.name(), name);
        assert!(
            OwnedSegment::create(&name, 10).is_err(),
            "names are exclusive"
        );
        // SAFETY: 8192 mapped bytes.
        unsafe { segment.start().add(5000).write(42) };
        // Another process would register (map) it by name, as a client region.
        let registry = RegionRegistry::new();
        registry.register("seen", &name, 4096, 4096).unwrap();
        assert_eq!(registry.get("seen").unwrap().read(904, 1).unwrap(), [42]);
        drop(segment);
        assert!(!std::path::Path::new(&format!("/dev/shm{name}")).exists());
    }

    #[test]
    fn unregister_all_forgets_every_region() {
        let object = Object::new("all", 16, 0);
        let registry = RegionRegistry::new();
        registry.register("x", &object.key, 0, 8).unwrap();
        registry.register("y", &object.key, 8, 8).unwrap();
        assert_eq!(registry.unregister_all(), 2);
        assert!(registry.status(None).unwrap().is_empty());
    }
}
