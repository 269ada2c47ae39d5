//! A file system that forgets what was not synced, for the power-cut test: FUSE (fuser's
//! pure-Rust mount, so only `/dev/fuse` and root are needed) over files held in memory.
//! Every file keeps its contents as written and as last fsynced; every directory keeps
//! its entries as they are and as last fsynced. [`CutFs::cut`] puts everything back to
//! what was synced — a file whose name was synced but whose data never was comes back
//! empty, a name never synced into its directory is gone — as a power cut does to a disk
//! that kept only what was flushed. Hard links are refused (git then renames).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

const TTL: Duration = Duration::from_secs(1);

#[derive(Clone)]
enum Content {
    File { data: Vec<u8>, synced: Vec<u8> },
    Dir { entries: BTreeMap<OsString, u64>, synced: BTreeMap<OsString, u64> },
    Symlink(PathBuf),
}

#[derive(Clone)]
struct Node {
    content: Content,
    perm: u16,
    mtime: SystemTime,
}

/// The files, shared between the mounts of one test.
#[derive(Default)]
struct Nodes {
    nodes: BTreeMap<u64, Node>,
    next: u64,
}

impl Nodes {
    fn new() -> Nodes {
        let root = Node {
            content: Content::Dir { entries: BTreeMap::new(), synced: BTreeMap::new() },
            perm: 0o755,
            mtime: SystemTime::now(),
        };
        Nodes { nodes: BTreeMap::from([(1, root)]), next: 2 }
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let node = self.nodes.get(&ino)?;
        let (kind, size) = match &node.content {
            Content::File { data, .. } => (FileType::RegularFile, data.len() as u64),
            Content::Dir { entries, .. } => (FileType::Directory, entries.len() as u64),
            Content::Symlink(target) => (FileType::Symlink, target.as_os_str().len() as u64),
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: node.mtime,
            mtime: node.mtime,
            ctime: node.mtime,
            crtime: node.mtime,
            kind,
            perm: node.perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn entries(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match self.nodes.get_mut(&dir).map(|n| &mut n.content) {
            Some(Content::Dir { entries, .. }) => Ok(entries),
            Some(_) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn add(&mut self, parent: u64, name: &OsStr, content: Content, perm: u16) -> Result<FileAttr, Errno> {
        if self.entries(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(ino, Node { content, perm, mtime: SystemTime::now() });
        self.entries(parent)?.insert(name.to_owned(), ino);
        self.touch(parent);
        Ok(self.attr(ino).expect("just added"))
    }

    fn touch(&mut self, ino: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.mtime = SystemTime::now();
        }
    }

    /// Back to what was synced: each directory reachable from the root through synced
    /// names holds its synced names, each file its synced bytes.
    fn cut(&mut self) {
        let mut kept = BTreeMap::new();
        let mut stack = vec![1u64];
        while let Some(ino) = stack.pop() {
            let Some(node) = self.nodes.get(&ino) else { continue };
            if kept.contains_key(&ino) {
                continue;
            }
            let mut node = node.clone();
            match &mut node.content {
                Content::File { data, synced } => *data = synced.clone(),
                Content::Dir { entries, synced } => {
                    *entries = synced.clone();
                    stack.extend(entries.values().copied());
                }
                Content::Symlink(_) => {}
            }
            kept.insert(ino, node);
        }
        self.nodes = kept;
    }
}

/// The file system; clones share the files.
#[derive(Clone)]
pub struct CutFs {
    nodes: Arc<Mutex<Nodes>>,
}

/// A mounted [`CutFs`]; unmounted on drop.
pub struct Mounted {
    _session: fuser::BackgroundSession,
}

impl CutFs {
    /// An empty file system, or `None` with the reason it cannot be mounted here.
    pub fn new() -> Result<CutFs, String> {
        if !Path::new("/dev/fuse").exists() {
            return Err("/dev/fuse does not exist".into());
        }
        if !rustix::process::geteuid().is_root() {
            return Err("mounting needs root".into());
        }
        Ok(CutFs { nodes: Arc::new(Mutex::new(Nodes::new())) })
    }

    /// Mounts the files at `at`.
    pub fn mount(&self, at: &Path) -> std::io::Result<Mounted> {
        let mut config = fuser::Config::default();
        config.mount_options = vec![fuser::MountOption::FSName("hive-cut".into())];
        let session = fuser::spawn_mount(self.clone(), at, &config)?;
        Ok(Mounted { _session: session })
    }

    /// The power cut: everything not synced is gone. Unmount first.
    pub fn cut(&self) {
        self.nodes.lock().unwrap().cut();
    }

    fn with<T>(&self, f: impl FnOnce(&mut Nodes) -> T) -> T {
        f(&mut self.nodes.lock().unwrap())
    }
}

impl Filesystem for CutFs {
    fn lookup(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.with(|n| {
            let ino = *n.entries(parent.0)?.get(name).ok_or(Errno::ENOENT)?;
            n.attr(ino).ok_or(Errno::ENOENT)
        });
        match found {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _: &Request, ino: INodeNo, _: Option<FileHandle>, reply: ReplyAttr) {
        match self.with(|n| n.attr(ino.0)) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let attr = self.with(|n| {
            let node = n.nodes.get_mut(&ino.0)?;
            if let Some(mode) = mode {
                node.perm = (mode & 0o7777) as u16;
            }
            if let (Some(size), Content::File { data, .. }) = (size, &mut node.content) {
                data.resize(size as usize, 0);
            }
            node.mtime = match mtime {
                Some(TimeOrNow::SpecificTime(t)) => t,
                _ => SystemTime::now(),
            };
            n.attr(ino.0)
        });
        match attr {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _: &Request, ino: INodeNo, reply: ReplyData) {
        let target = self.with(|n| match n.nodes.get(&ino.0).map(|n| &n.content) {
            Some(Content::Symlink(target)) => Some(target.clone()),
            _ => None,
        });
        match target {
            Some(target) => reply.data(target.as_os_str().as_encoded_bytes()),
            None => reply.error(Errno::EINVAL),
        }
    }

    fn mkdir(&self, _: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let dir = Content::Dir { entries: BTreeMap::new(), synced: BTreeMap::new() };
        match self.with(|n| n.add(parent.0, name, dir, (mode & !umask & 0o7777) as u16)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let removed = self.with(|n| {
            n.entries(parent.0)?.remove(name).ok_or(Errno::ENOENT)?;
            n.touch(parent.0);
            Ok(())
        });
        match removed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let removed = self.with(|n| {
            let ino = *n.entries(parent.0)?.get(name).ok_or(Errno::ENOENT)?;
            if !n.entries(ino)?.is_empty() {
                return Err(Errno::ENOTEMPTY);
            }
            n.entries(parent.0)?.remove(name);
            n.touch(parent.0);
            Ok(())
        });
        match removed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, _: &Request, parent: INodeNo, name: &OsStr, target: &Path, reply: ReplyEntry) {
        match self.with(|n| n.add(parent.0, name, Content::Symlink(target.to_path_buf()), 0o777)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let renamed = self.with(|n| {
            let ino = *n.entries(parent.0)?.get(name).ok_or(Errno::ENOENT)?;
            let existing = n.entries(newparent.0)?.get(newname).copied();
            if existing.is_some() && flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if let Some(old) = existing {
                if matches!(n.nodes.get(&old).map(|n| &n.content), Some(Content::Dir { entries, .. }) if !entries.is_empty())
                {
                    return Err(Errno::ENOTEMPTY);
                }
            }
            n.entries(parent.0)?.remove(name);
            n.entries(newparent.0)?.insert(newname.to_owned(), ino);
            n.touch(parent.0);
            n.touch(newparent.0);
            Ok(())
        });
        match renamed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _: &Request, ino: INodeNo, _: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(ino.0), FopenFlags::empty());
    }

    fn read(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        size: u32,
        _: OpenFlags,
        _: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let bytes = self.with(|n| match n.nodes.get(&ino.0).map(|n| &n.content) {
            Some(Content::File { data, .. }) => {
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                Ok(data[start..end].to_vec())
            }
            Some(_) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        });
        match bytes {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        bytes: &[u8],
        _: WriteFlags,
        _: OpenFlags,
        _: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let written = self.with(|n| {
            let node = n.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
            let Content::File { data, .. } = &mut node.content else { return Err(Errno::EISDIR) };
            let end = offset as usize + bytes.len();
            if data.len() < end {
                data.resize(end, 0);
            }
            data[offset as usize..end].copy_from_slice(bytes);
            node.mtime = SystemTime::now();
            Ok(bytes.len() as u32)
        });
        match written {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _: &Request, _: INodeNo, _: FileHandle, _: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _: &Request, ino: INodeNo, _: FileHandle, _: bool, reply: ReplyEmpty) {
        self.with(|n| match n.nodes.get_mut(&ino.0).map(|n| &mut n.content) {
            Some(Content::File { data, synced }) => *synced = data.clone(),
            // An fsync of a directory opened as a file (`File::open(dir)?.sync_all()`).
            Some(Content::Dir { entries, synced }) => *synced = entries.clone(),
            _ => {}
        });
        reply.ok();
    }

    fn readdir(&self, _: &Request, ino: INodeNo, _: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let listed = self.with(|n| {
            let entries = n.entries(ino.0)?.clone();
            let mut out = vec![
                (ino.0, FileType::Directory, OsString::from(".")),
                (1, FileType::Directory, "..".into()),
            ];
            for (name, child) in entries {
                if let Some(attr) = n.attr(child) {
                    out.push((child, attr.kind, name));
                }
            }
            Ok(out)
        });
        match listed {
            Ok(entries) => {
                for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(child), (i + 1) as u64, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(&self, _: &Request, ino: INodeNo, _: FileHandle, _: bool, reply: ReplyEmpty) {
        self.with(|n| {
            if let Some(Content::Dir { entries, synced }) = n.nodes.get_mut(&ino.0).map(|n| &mut n.content) {
                *synced = entries.clone();
            }
        });
        reply.ok();
    }

    fn statfs(&self, _: &Request, _: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&self, _: &Request, _: INodeNo, _: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        _: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let file = Content::File { data: Vec::new(), synced: Vec::new() };
        match self.with(|n| n.add(parent.0, name, file, (mode & !umask & 0o7777) as u16)) {
            Ok(attr) => {
                reply.created(&TTL, &attr, Generation(0), FileHandle(attr.ino.0), FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }
}
