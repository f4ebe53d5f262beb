//! Who a request's `user` names, from the text of the image's `/etc/passwd` and `/etc/group`, parsed
//! here rather than through libc's `getpwnam` (the agent is a static binary: glibc's NSS lookups do not
//! work from one, and the image's files are the truth anyway). Pure: the caller reads the files.

/// A request's `user`: `name`, `uid`, `name:group` or `uid:gid` (a group by name or number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserSpec {
    pub user: Name,
    pub group: Option<Name>,
}

/// A user or group given by name or by number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Name {
    Id(u32),
    Named(String),
}

/// Whom to run a command as: ids to switch to, and the account's home and name when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups: the primary group and every group of `/etc/group` listing the user.
    pub groups: Vec<u32>,
    /// Login name, when `/etc/passwd` knows the user.
    pub name: Option<String>,
    /// Home directory, when `/etc/passwd` knows the user.
    pub home: Option<String>,
}

fn name(text: &str) -> Result<Name, String> {
    if text.is_empty() {
        return Err("an empty name".into());
    }
    if text.bytes().all(|byte| byte.is_ascii_digit()) {
        return text
            .parse()
            .map(Name::Id)
            .map_err(|_| format!("`{text}` is out of range for an id"));
    }
    if text.contains(['\0', '\n', '/']) {
        return Err(format!("`{text}` is not a valid name"));
    }
    Ok(Name::Named(text.to_string()))
}

/// Parses `user`, `uid`, `user:group` or `uid:gid`.
pub fn parse_user_spec(text: &str) -> Result<UserSpec, String> {
    let (user, group) = match text.split_once(':') {
        Some((user, group)) => (user, Some(group)),
        None => (text, None),
    };
    Ok(UserSpec {
        user: name(user).map_err(|error| format!("invalid `user` `{text}`: {error}"))?,
        group: group
            .map(name)
            .transpose()
            .map_err(|error| format!("invalid `user` `{text}`: {error}"))?,
    })
}

/// One line of `/etc/passwd`: `name:password:uid:gid:gecos:home:shell`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
}

fn passwd_entries(passwd: &str) -> impl Iterator<Item = PasswdEntry<'_>> {
    passwd.lines().filter_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 7 || line.starts_with('#') {
            return None;
        }
        Some(PasswdEntry {
            name: fields[0],
            uid: fields[2].parse().ok()?,
            gid: fields[3].parse().ok()?,
            home: fields[5],
        })
    })
}

/// One line of `/etc/group`: `name:password:gid:member,member`.
struct GroupEntry<'a> {
    name: &'a str,
    gid: u32,
    members: Vec<&'a str>,
}

fn group_entries(group: &str) -> impl Iterator<Item = GroupEntry<'_>> {
    group.lines().filter_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 4 || line.starts_with('#') {
            return None;
        }
        Some(GroupEntry {
            name: fields[0],
            gid: fields[2].parse().ok()?,
            members: fields[3].split(',').filter(|m| !m.is_empty()).collect(),
        })
    })
}

/// Resolves `spec` against the text of `/etc/passwd` and `/etc/group`. A user named must exist in
/// `passwd`, a group named in `group`; a numeric uid need not exist (its primary group is then the
/// same number, unless a group is given).
pub fn resolve(spec: &UserSpec, passwd: &str, group: &str) -> Result<Account, String> {
    let entry = match &spec.user {
        Name::Named(name) => Some(
            passwd_entries(passwd)
                .find(|entry| entry.name == name)
                .ok_or_else(|| format!("no user `{name}` in the image's /etc/passwd"))?,
        ),
        Name::Id(uid) => passwd_entries(passwd).find(|entry| entry.uid == *uid),
    };
    let uid = match &spec.user {
        Name::Id(uid) => *uid,
        Name::Named(_) => entry.as_ref().map_or(0, |entry| entry.uid),
    };
    let gid = match &spec.group {
        Some(Name::Id(gid)) => *gid,
        Some(Name::Named(name)) => group_entries(group)
            .find(|entry| entry.name == name)
            .map(|entry| entry.gid)
            .ok_or_else(|| format!("no group `{name}` in the image's /etc/group"))?,
        None => entry.as_ref().map_or(uid, |entry| entry.gid),
    };
    let mut groups = vec![gid];
    if let Some(entry) = &entry {
        for group in group_entries(group) {
            if group.members.contains(&entry.name) && !groups.contains(&group.gid) {
                groups.push(group.gid);
            }
        }
    }
    Ok(Account {
        uid,
        gid,
        groups,
        name: entry.as_ref().map(|entry| entry.name.to_string()),
        home: entry
            .as_ref()
            .map(|entry| entry.home.to_string())
            .filter(|home| !home.is_empty()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        # a comment\n\
        nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
        dev:x:1000:1000:Dev,,,:/home/dev:/bin/sh\n\
        broken:x:notanumber:1:::\n\
        short:x:5\n";
    const GROUP: &str =
        "root:x:0:\nwheel:x:10:dev,other\nnogroup:x:65534:\ndev:x:1000:\ndocker:x:999:other,dev\n";

    fn resolved(text: &str) -> Result<Account, String> {
        resolve(&parse_user_spec(text)?, PASSWD, GROUP)
    }

    #[test]
    fn specs_parse_names_and_numbers() {
        assert_eq!(
            parse_user_spec("65534").unwrap(),
            UserSpec {
                user: Name::Id(65534),
                group: None
            }
        );
        assert_eq!(
            parse_user_spec("1000:50").unwrap(),
            UserSpec {
                user: Name::Id(1000),
                group: Some(Name::Id(50))
            }
        );
        assert_eq!(
            parse_user_spec("dev:wheel").unwrap(),
            UserSpec {
                user: Name::Named("dev".into()),
                group: Some(Name::Named("wheel".into()))
            }
        );
        for bad in ["", ":", "1000:", ":5", "99999999999", "a/b", "1:2:3x/"] {
            assert!(parse_user_spec(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_come_from_passwd_with_their_groups() {
        let dev = resolved("dev").unwrap();
        assert_eq!((dev.uid, dev.gid), (1000, 1000));
        assert_eq!(dev.groups, vec![1000, 10, 999]);
        assert_eq!(dev.home.as_deref(), Some("/home/dev"));
        assert_eq!(dev.name.as_deref(), Some("dev"));
        let nobody = resolved("nobody").unwrap();
        assert_eq!(
            (nobody.uid, nobody.gid, nobody.groups),
            (65534, 65534, vec![65534])
        );
    }

    #[test]
    fn numbers_need_no_entry() {
        let known = resolved("65534").unwrap();
        assert_eq!(
            (known.uid, known.gid, known.name.as_deref()),
            (65534, 65534, Some("nobody"))
        );
        let unknown = resolved("4321").unwrap();
        assert_eq!(
            (unknown.uid, unknown.gid, unknown.groups),
            (4321, 4321, vec![4321])
        );
        assert_eq!((unknown.name, unknown.home), (None, None));
        let explicit = resolved("4321:7").unwrap();
        assert_eq!((explicit.uid, explicit.gid), (4321, 7));
        let named_group = resolved("dev:nogroup").unwrap();
        assert_eq!(
            (named_group.gid, named_group.groups),
            (65534, vec![65534, 10, 999])
        );
    }

    #[test]
    fn unknown_names_are_errors() {
        assert_eq!(
            resolved("ghost").unwrap_err(),
            "no user `ghost` in the image's /etc/passwd"
        );
        assert_eq!(
            resolved("dev:ghosts").unwrap_err(),
            "no group `ghosts` in the image's /etc/group"
        );
        assert!(resolved("broken").is_err(), "malformed lines are skipped");
        assert!(resolved("short").is_err());
        assert!(resolve(&parse_user_spec("root").unwrap(), "", "").is_err());
    }
}
