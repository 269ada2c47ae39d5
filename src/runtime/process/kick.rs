//! The fence kick: SIGUSR1 to an agent's main process, sent only when it cannot end
//! the process. SIGUSR1's default action is to terminate, so a plain kick killed every
//! agent that does not handle it ("killed by signal 10") before its graceful stop ever
//! sent SIGTERM. The kick is a wake-up, not the contract: the fence file is, and an
//! agent that handles no SIGUSR1 finds the file itself or is stopped when the drain runs
//! out.
//!
//! Whether the process handles the signal comes from the `SigCgt` (caught) and `SigIgn`
//! (ignored) masks of `/proc/<pid>/status`. The check and the send must concern one
//! process, so both go through a pidfd: [`kick`] opens it first, checks that the pid
//! still names the process the supervisor spawned (its start time, as the pid file
//! records it: between the supervisor reaping a process and the runtime forgetting it,
//! the pid may already be someone else's), reads the masks, and sends with
//! `pidfd_send_signal`, which fails with `ESRCH` rather than reaching another process
//! if ours ended in between. A process that installs its handler after the check is not
//! kicked this time; it sees the fence file.

use std::io;

use rustix::process::{Pid, PidfdFlags, Signal};

use super::supervisor;

/// What one process does with a signal, from its `/proc/<pid>/status` masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// A handler is installed (`SigCgt`).
    Caught,
    /// It is ignored (`SigIgn`).
    Ignored,
    /// Neither: the default action, which for SIGUSR1 ends the process.
    Default,
}

/// What [`kick`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Sent: the process catches or ignores the signal.
    Sent(Disposition),
    /// Not sent, and why.
    Withheld(String),
    /// The process the supervisor spawned is gone.
    Gone,
}

/// The disposition of signal number `signo` (1-based, as in `kill -l`) in the text of a
/// `/proc/<pid>/status` file; `None` when the masks are missing or malformed.
pub fn disposition(status: &str, signo: i32) -> Option<Disposition> {
    let bit = u32::try_from(signo.checked_sub(1)?).ok().filter(|bit| *bit < 64)?;
    let mask = |name: &str| {
        let line = status.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))?;
        u64::from_str_radix(line.trim(), 16).ok()
    };
    let (caught, ignored) = (mask("SigCgt")?, mask("SigIgn")?);
    Some(if caught >> bit & 1 == 1 {
        Disposition::Caught
    } else if ignored >> bit & 1 == 1 {
        Disposition::Ignored
    } else {
        Disposition::Default
    })
}

/// Sends `signal` to process `pid` — the one started at `start_ticks` (see
/// [`supervisor::start_ticks`]) — only when it catches or ignores it. Never fails: a
/// kick that cannot be sent safely is withheld, and says why; the fence is the contract.
pub fn kick(pid: u32, start_ticks: Option<u64>, signal: Signal) -> Outcome {
    let withheld = |why: String| Outcome::Withheld(why);
    let Some(raw) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return withheld(format!("{pid} is not a valid pid"));
    };
    let Some(started) = start_ticks else {
        return withheld(format!("the start time of pid {pid} is unknown"));
    };
    let pidfd = match rustix::process::pidfd_open(raw, PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return Outcome::Gone,
        Err(errno) => {
            return withheld(format!("cannot open a pidfd for pid {pid}: {}", io::Error::from(errno)))
        }
    };
    // From here the pid cannot be reused while the pidfd's process lives, and the send
    // below fails if it died: what /proc says is about the process the pidfd holds.
    if supervisor::start_ticks(pid) != Some(started) {
        return Outcome::Gone;
    }
    let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => status,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Outcome::Gone,
        Err(e) => return withheld(format!("cannot read /proc/{pid}/status: {e}")),
    };
    let disposition = match disposition(&status, signal.as_raw()) {
        Some(Disposition::Default) => {
            return withheld(format!(
                "pid {pid} does not handle it, and its default action would end the agent"
            ))
        }
        Some(disposition) => disposition,
        None => return withheld(format!("/proc/{pid}/status has no signal masks")),
    };
    match rustix::process::pidfd_send_signal(&pidfd, signal) {
        Ok(()) => Outcome::Sent(disposition),
        Err(rustix::io::Errno::SRCH) => Outcome::Gone,
        Err(errno) => withheld(format!("cannot send it to pid {pid}: {}", io::Error::from(errno))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/<pid>/status` as Linux writes it, with the given masks.
    fn status(caught: &str, ignored: &str) -> String {
        format!(
            "Name:\tsh\nState:\tS (sleeping)\nPid:\t42\nSigQ:\t0/63476\nSigPnd:\t0000000000000000\n\
             ShdPnd:\t0000000000000000\nSigBlk:\t0000000000000000\nSigIgn:\t{ignored}\n\
             SigCgt:\t{caught}\nCapInh:\t0000000000000000\n"
        )
    }

    #[test]
    fn the_disposition_of_sigusr1_is_read_from_the_masks() {
        const USR1: i32 = 10;
        let cases: &[(&str, &str, &str, Option<Disposition>)] = &[
            // `trap 'rm -f "$HIVE_FENCE"' USR1` in sh: bit 9 caught (plus SIGCHLD, 17).
            ("a sh that traps USR1", "0000000000010200", "0000000000000004", Some(Disposition::Caught)),
            ("trap '' USR1", "0000000000010000", "0000000000000204", Some(Disposition::Ignored)),
            ("a plain sleep loop", "0000000000010002", "0000000000000004", Some(Disposition::Default)),
            ("nothing at all", "0000000000000000", "0000000000000000", Some(Disposition::Default)),
            ("caught wins over ignored", "0000000000000200", "0000000000000200", Some(Disposition::Caught)),
            ("every signal caught", "ffffffffffffffff", "0000000000000000", Some(Disposition::Caught)),
            (
                "SIGUSR2 (bit 11) is not USR1",
                "0000000000000800",
                "0000000000000000",
                Some(Disposition::Default),
            ),
            ("a malformed mask", "not-hex", "0000000000000000", None),
        ];
        for (why, caught, ignored, expected) in cases {
            assert_eq!(disposition(&status(caught, ignored), USR1), *expected, "{why}");
        }
        assert_eq!(disposition("Name:\tsh\n", USR1), None, "no masks");
        assert_eq!(disposition(&status("0", "0"), 0), None, "no signal 0");
        assert_eq!(disposition(&status("0", "0"), 65), None, "beyond the 64-bit masks");
    }

    /// A real process, kicked through the real pidfd path: one that traps SIGUSR1 gets
    /// it, one that does not is left alone and keeps running, and a process whose start
    /// time differs (the pid reused) is never signalled.
    #[test]
    fn only_a_process_that_handles_sigusr1_is_kicked() {
        use std::process::{Command, Stdio};
        let tmp = tempfile::tempdir().unwrap();
        let kicked = tmp.path().join("kicked");
        let spawn = |script: &str| {
            let child = Command::new("sh")
                .arg("-c")
                .arg(script)
                .env("KICKED", &kicked)
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            // Until the shell has run its `trap`, its masks say Default.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !tmp.path().join(format!("ready-{}", child.id())).exists() {
                assert!(std::time::Instant::now() < deadline, "the shell never got ready");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            child
        };
        let dir = tmp.path().display();
        let handles = format!(
            "trap ': > \"$KICKED\"' USR1; : > {dir}/ready-$$; while [ ! -e \"$KICKED\" ]; do sleep 0.05; done"
        );
        let plain = format!(": > {dir}/ready-$$; while :; do sleep 0.05; done");

        let mut handler = spawn(&handles);
        let ticks = supervisor::start_ticks(handler.id());
        let wrong = ticks.map(|t| t + 1);
        assert_eq!(kick(handler.id(), wrong, Signal::USR1), Outcome::Gone, "another start time");
        assert_eq!(kick(handler.id(), ticks, Signal::USR1), Outcome::Sent(Disposition::Caught));
        let exit = handler.wait().unwrap();
        assert!(exit.success(), "the handler ran and the loop ended: {exit:?}");
        assert!(kicked.exists());

        std::fs::remove_file(&kicked).unwrap();
        let mut sleeper = spawn(&plain);
        let ticks = supervisor::start_ticks(sleeper.id());
        let outcome = kick(sleeper.id(), ticks, Signal::USR1);
        assert!(
            matches!(&outcome, Outcome::Withheld(why) if why.contains("does not handle it")),
            "{outcome:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(sleeper.try_wait().unwrap().is_none(), "the plain loop still runs");
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        assert_eq!(kick(sleeper.id(), ticks, Signal::USR1), Outcome::Gone, "reaped");
    }
}
