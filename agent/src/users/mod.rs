//! Running commands as another user (`user` on exec, background processes and sessions): the name or
//! ids are resolved from the image's `/etc/passwd` and `/etc/group` (`accounts`, pure), the agent checks
//! that it can switch at all (it must run as root), and the child switches in a `pre_exec` hook:
//! `setgroups`, `setgid`, `setuid`, in that order (after `setuid` nothing else could be changed).
//!
//! A `pre_exec` hook sends std down its `fork` + `exec` path (see `process_group`): only commands with
//! a `user` pay for that.

pub mod accounts;

use std::io;

pub use accounts::Account;
use accounts::{parse_user_spec, resolve};

use crate::error::AgentError;

/// Where accounts are read from.
const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";

/// Whether an agent with effective ids `euid`/`egid` can run commands as `account`: as root always;
/// otherwise only as itself, which needs no switch (`Ok(false)`). Pure.
pub fn needs_switch(account: &Account, euid: u32, egid: u32) -> Result<bool, String> {
    if euid == 0 {
        return Ok(true);
    }
    if account.uid == euid && account.gid == egid {
        return Ok(false);
    }
    Err(format!(
        "the agent runs as uid {euid}, not root, so it cannot run commands as uid {}:{}; leave out `user`, or run the agent as root",
        account.uid, account.gid
    ))
}

/// Resolves a request's `user` (400 when the user or group does not exist, 403 when the agent cannot
/// switch to it); `None` when the command runs as the agent's own user anyway.
pub fn resolve_user(text: &str) -> Result<Option<Account>, AgentError> {
    let spec = parse_user_spec(text).map_err(AgentError::BadRequest)?;
    // A file the image lacks is empty: numeric ids still work, names do not exist.
    let passwd = std::fs::read_to_string(PASSWD).unwrap_or_default();
    let group = std::fs::read_to_string(GROUP).unwrap_or_default();
    let account = resolve(&spec, &passwd, &group).map_err(AgentError::BadRequest)?;
    // SAFETY: plain syscalls without arguments.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    match needs_switch(&account, euid, egid) {
        Ok(true) => Ok(Some(account)),
        Ok(false) => Ok(None),
        Err(message) => Err(AgentError::Forbidden(message)),
    }
}

/// `HOME`, `USER` and `LOGNAME` of `account` when `/etc/passwd` knows it, for the variables a request
/// does not set itself.
pub fn account_env(account: &Account) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if let Some(home) = &account.home {
        env.push(("HOME".to_string(), home.clone()));
    }
    if let Some(name) = &account.name {
        env.push(("USER".to_string(), name.clone()));
        env.push(("LOGNAME".to_string(), name.clone()));
    }
    env
}

/// Adds `account`'s variables to `env` where `env` does not set them.
pub fn add_account_env(env: &mut Vec<(String, String)>, account: &Account) {
    for (key, value) in account_env(account) {
        if !env.iter().any(|(existing, _)| *existing == key) {
            env.push((key, value));
        }
    }
}

/// Makes the child of `command` switch to `account` before it executes its program.
pub fn switch_on_exec(command: &mut tokio::process::Command, account: &Account) {
    let groups: Vec<libc::gid_t> = account.groups.clone();
    let (uid, gid) = (account.uid, account.gid);
    // SAFETY: the hook only makes three system calls (async-signal-safe), on memory allocated before
    // the fork.
    unsafe {
        command.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(uid: u32, gid: u32) -> Account {
        Account {
            uid,
            gid,
            groups: vec![gid],
            name: Some("dev".into()),
            home: Some("/home/dev".into()),
        }
    }

    #[test]
    fn only_root_switches() {
        assert_eq!(needs_switch(&account(1000, 1000), 0, 0), Ok(true));
        assert_eq!(needs_switch(&account(0, 0), 0, 0), Ok(true));
        assert_eq!(needs_switch(&account(1000, 1000), 1000, 1000), Ok(false));
        let refused = needs_switch(&account(0, 0), 1000, 1000).unwrap_err();
        assert!(refused.contains("not root"), "{refused}");
        assert!(needs_switch(&account(1000, 5), 1000, 1000).is_err());
    }

    #[test]
    fn account_variables_fill_only_what_the_request_leaves_out() {
        let mut env = vec![("HOME".to_string(), "/work".to_string())];
        add_account_env(&mut env, &account(1000, 1000));
        assert_eq!(
            env,
            vec![
                ("HOME".to_string(), "/work".to_string()),
                ("USER".to_string(), "dev".to_string()),
                ("LOGNAME".to_string(), "dev".to_string()),
            ]
        );
        let bare = Account {
            name: None,
            home: None,
            ..account(5, 5)
        };
        assert!(account_env(&bare).is_empty());
    }

    #[test]
    fn unknown_users_are_bad_requests() {
        assert!(matches!(
            resolve_user("no-such-user-here"),
            Err(AgentError::BadRequest(message)) if message.contains("no user `no-such-user-here`")
        ));
        assert!(matches!(resolve_user("1:"), Err(AgentError::BadRequest(_))));
    }
}
