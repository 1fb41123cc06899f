//! The settings end to end: each source, their precedence per key, the errors that name what
//! to fix, and the daemon configuration that comes out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use forkd_store::Durability;

use super::*;
use crate::daemon::{ProviderKind, TlsFiles};

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |name| map.get(name).cloned()
}

fn resolve(flags: &ServeFlags, vars: &[(&str, &str)], file: &str) -> anyhow::Result<Settings> {
    let file = FileConfig::parse(file)?;
    Settings::resolve(flags, env(vars), &file, Path::new("/srv/forkd"))
}

#[test]
fn models_add_windows_and_prices_to_the_table() {
    let file = "[models.local-llama]\ncontext_window = 32768\n\
                [models.claude-sonnet-4-5]\ninput_per_mtok = 2.5\n";
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    let engine = s.daemon_config("/srv/forkd".into()).unwrap().engine;
    let local = engine.models.get("local-llama").unwrap();
    assert_eq!(local.context_window, 32_768);
    assert_eq!((local.input_per_mtok, local.output_per_mtok), (0.0, 0.0));
    let sonnet = engine.models.get("claude-sonnet-4-5").unwrap();
    assert_eq!(sonnet.input_per_mtok, 2.5);
    assert_eq!(
        sonnet.output_per_mtok, 15.0,
        "keys left out keep the table's value"
    );
    assert_eq!(sonnet.context_window, 200_000);
    for (bad, says) in [
        (
            "[models.new]\ninput_per_mtok = 1.0\n",
            "context_window is required",
        ),
        ("[models.new]\ncontext_window = 0\n", "must be positive"),
        (
            "[models.new]\ncontext_window = 8\noutput_per_mtok = -1.0\n",
            "not negative",
        ),
    ] {
        let err = resolve(&ServeFlags::default(), &[], bad).unwrap_err();
        assert!(format!("{err:#}").contains(says), "{bad}: {err:#}");
    }
    assert!(resolve(&ServeFlags::default(), &[], "[models.x]\nwindow = 8\n").is_err());
}

#[test]
fn caps_and_tenant_budgets_come_from_the_file_and_the_environment() {
    let file = "max_running_agents = 8\nmax_concurrent_requests = 0\n\
                [tenants.ci]\nbudget_usd = 2.5\n[tenants.team]\nbudget_tokens = 1000\n";
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    assert_eq!(s.max_running_agents, Some(8));
    assert_eq!(s.max_concurrent_requests, None, "0 means no cap");
    assert_eq!(s.tenant_budgets["ci"].usd, Some(2.5));
    assert_eq!(s.tenant_budgets["team"].tokens, Some(1000));
    let s = resolve(
        &ServeFlags::default(),
        &[
            ("FORKD_MAX_RUNNING_AGENTS", "3"),
            ("FORKD_MAX_AGENT_DEPTH", "1"),
        ],
        file,
    )
    .unwrap();
    assert_eq!(s.max_running_agents, Some(3));
    assert_eq!(s.max_agent_depth, 1);
    let engine = s.daemon_config("/srv/forkd".into()).unwrap().engine;
    assert_eq!(engine.max_running_agents, Some(3));
    assert_eq!(engine.max_agent_depth, 1);
    assert_eq!(engine.tenant_budgets["ci"].usd, Some(2.5));
    let defaults = resolve(&ServeFlags::default(), &[], "").unwrap();
    assert_eq!(defaults.max_running_agents, Some(256));
    assert_eq!(defaults.max_agent_depth, 2);
    assert_eq!(defaults.compact_threshold, 0.9);
    let flags = ServeFlags {
        compact_threshold: Some(0.75),
        ..ServeFlags::default()
    };
    let s = resolve(
        &flags,
        &[("FORKD_COMPACT_THRESHOLD", "0.8")],
        "compact_threshold = 0.5\n",
    )
    .unwrap();
    assert_eq!(s.compact_threshold, 0.75, "the flag wins");
    let s = resolve(&ServeFlags::default(), &[], "compact_threshold = 0.5\n").unwrap();
    assert_eq!(
        s.daemon_config("/srv".into())
            .unwrap()
            .engine
            .compact_threshold,
        0.5
    );
    let bad = resolve(&ServeFlags::default(), &[], "compact_threshold = 1.5\n").unwrap_err();
    assert!(
        format!("{bad:#}").contains("between 0.1 and 1.0"),
        "{bad:#}"
    );
    let bad = resolve(
        &ServeFlags::default(),
        &[],
        "[tenants.x]\nbudget_usd = -1\n",
    );
    assert!(bad.unwrap_err().to_string().contains("tenants.x"));
    let typo = resolve(&ServeFlags::default(), &[], "[tenants.x]\nbudget = 1\n");
    assert!(typo.is_err());
}

#[test]
fn defaults_apply_when_nothing_is_set() {
    let s = resolve(&ServeFlags::default(), &[], "").unwrap();
    assert_eq!(s.provider, ProviderKind::Sim);
    assert_eq!(s.sim_speed, 1.0);
    assert_eq!(s.auto_background_secs, 120);
    assert!(s.fork_always_async);
    assert!(s.warmup_gating);
    assert_eq!(s.listen, None);
    assert_eq!(s.grace, Duration::from_secs(10));
    assert!(!s.fsync_every_commit);
    assert_eq!(s.log, "info");
    assert_eq!(s.log_format, LogFormat::Text);
    assert_eq!(s.tls, None);
}

#[test]
fn flag_beats_environment_beats_file_beats_default() {
    let file = r#"
        sim_speed = 0.5
        auto_background_secs = 30
        provider = "anthropic"
        log = "debug"
        grace = "3s"
        [anthropic]
        api_key = "from-file"
        base_url = "http://file.example"
    "#;
    // The file alone.
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    assert_eq!((s.sim_speed, s.auto_background_secs), (0.5, 30));
    assert_eq!(s.provider, ProviderKind::Anthropic);
    assert_eq!((s.log.as_str(), s.grace), ("debug", Duration::from_secs(3)));

    // The environment over the file, per key; an empty variable is unset.
    let vars = [
        ("FORKD_SIM_SPEED", "0"),
        ("FORKD_PROVIDER", "SIM"),
        ("RUST_LOG", "warn"),
        ("FORKD_AUTO_BACKGROUND_SECS", ""),
        ("ANTHROPIC_API_KEY", "from-env"),
    ];
    let s = resolve(&ServeFlags::default(), &vars, file).unwrap();
    assert_eq!((s.sim_speed, s.auto_background_secs), (0.0, 30));
    assert_eq!(s.provider, ProviderKind::Sim);
    assert_eq!(s.log, "warn");
    assert_eq!(
        s.provider_vars
            .0
            .get("ANTHROPIC_API_KEY")
            .map(String::as_str),
        Some("from-env")
    );
    assert_eq!(
        s.provider_vars
            .0
            .get("ANTHROPIC_BASE_URL")
            .map(String::as_str),
        Some("http://file.example")
    );

    // A flag over both.
    let flags = ServeFlags {
        sim_speed: Some(2.0),
        provider: Some(ProviderKind::Openai),
        log: Some("error".into()),
        grace: Some(Duration::from_secs(1)),
        ..ServeFlags::default()
    };
    let s = resolve(&flags, &vars, file).unwrap();
    assert_eq!(s.sim_speed, 2.0);
    assert_eq!(s.provider, ProviderKind::Openai);
    assert_eq!(s.log, "error");
    assert_eq!(s.grace, Duration::from_secs(1));
}

#[test]
fn booleans_come_from_each_source() {
    let file = "fsync_every_commit = true\nwarmup_gating = false\nfork_always_async = false";
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    assert!(s.fsync_every_commit && !s.warmup_gating && !s.fork_always_async);

    let vars = [
        ("FORKD_FSYNC_EVERY_COMMIT", "no"),
        ("FORKD_WARMUP_GATING", "on"),
        ("FORKD_FORK_ALWAYS_ASYNC", "1"),
    ];
    let s = resolve(&ServeFlags::default(), &vars, file).unwrap();
    assert!(!s.fsync_every_commit && s.warmup_gating && s.fork_always_async);

    let flags = ServeFlags {
        fsync_every_commit: Some(true),
        no_warmup_gating: true,
        ..ServeFlags::default()
    };
    let s = resolve(&flags, &vars, file).unwrap();
    assert!(s.fsync_every_commit && !s.warmup_gating);

    let err = resolve(
        &ServeFlags::default(),
        &[("FORKD_FORK_ALWAYS_ASYNC", "maybe")],
        "",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("FORKD_FORK_ALWAYS_ASYNC=\"maybe\" is not a boolean"),
        "{err}"
    );
}

#[test]
fn listen_and_tls_paths_resolve_and_file_paths_are_relative_to_home() {
    let file = "listen = \"127.0.0.1:7070\"\ntls_cert = \"tls/cert.pem\"\ntls_key = \"/etc/k.pem\"";
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    assert_eq!(s.listen, Some(SocketAddr::from(([127, 0, 0, 1], 7070))));
    assert_eq!(
        s.tls,
        Some(TlsFiles {
            cert: PathBuf::from("/srv/forkd/tls/cert.pem"),
            key: PathBuf::from("/etc/k.pem"),
        })
    );
    let vars = [("FORKD_LISTEN", "127.0.0.1:9"), ("FORKD_TLS_CERT", "c.pem")];
    let s = resolve(&ServeFlags::default(), &vars, file).unwrap();
    assert_eq!(s.listen, Some(SocketAddr::from(([127, 0, 0, 1], 9))));
    assert_eq!(s.tls.map(|t| t.cert), Some(PathBuf::from("c.pem")));

    let err = resolve(&ServeFlags::default(), &[], "tls_cert = \"c.pem\"")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("TLS needs a private key too"), "{err}");
}

#[test]
fn the_secret_key_file_comes_from_its_layers_relative_to_home() {
    let s = resolve(&ServeFlags::default(), &[], "").unwrap();
    assert_eq!(
        s.secret_key_file, None,
        "the daemon picks $FORKD_HOME/secret.key"
    );
    let file = "secret_key_file = \"keys/forkd.key\"";
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    assert_eq!(
        s.secret_key_file,
        Some(PathBuf::from("/srv/forkd/keys/forkd.key"))
    );
    let vars = [("FORKD_SECRET_KEY_FILE", "/run/secrets/k")];
    let s = resolve(&ServeFlags::default(), &vars, file).unwrap();
    let flags = ServeFlags {
        secret_key_file: Some(PathBuf::from("/flag.key")),
        ..ServeFlags::default()
    };
    assert_eq!(s.secret_key_file, Some(PathBuf::from("/run/secrets/k")));
    let s = resolve(&flags, &vars, file).unwrap();
    let config = s.daemon_config(PathBuf::from("/h")).unwrap();
    assert_eq!(config.secret_key_file, Some(PathBuf::from("/flag.key")));
}

#[test]
fn ui_listen_comes_from_flag_env_or_file() {
    let file = "ui_listen = \"127.0.0.1:8080\"";
    let at = |port| Some(SocketAddr::from(([127, 0, 0, 1], port)));
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    assert_eq!(s.ui_listen, at(8080));
    let vars = [("FORKD_UI_LISTEN", "127.0.0.1:8081")];
    let s = resolve(&ServeFlags::default(), &vars, file).unwrap();
    assert_eq!(s.ui_listen, at(8081));
    let flags = ServeFlags {
        ui_listen: at(8082),
        ..ServeFlags::default()
    };
    let s = resolve(&flags, &vars, file).unwrap();
    let config = s.daemon_config(PathBuf::from("/srv/forkd")).unwrap();
    assert_eq!(config.ui_listen, at(8082));
    assert_eq!(
        resolve(&ServeFlags::default(), &[], "").unwrap().ui_listen,
        None
    );
    let err = resolve(&ServeFlags::default(), &[], "ui_listen = \"nowhere\"")
        .unwrap_err()
        .to_string();
    assert!(err.contains("ui_listen"), "{err}");
}

#[test]
fn metrics_listen_comes_from_flag_env_or_file() {
    let file = "metrics_listen = \"127.0.0.1:9100\"";
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    assert_eq!(
        s.metrics_listen,
        Some(SocketAddr::from(([127, 0, 0, 1], 9100)))
    );
    let vars = [("FORKD_METRICS_LISTEN", "127.0.0.1:9101")];
    let s = resolve(&ServeFlags::default(), &vars, file).unwrap();
    assert_eq!(
        s.metrics_listen,
        Some(SocketAddr::from(([127, 0, 0, 1], 9101)))
    );
    let flags = ServeFlags {
        metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9102))),
        ..ServeFlags::default()
    };
    let s = resolve(&flags, &vars, file).unwrap();
    let config = s.daemon_config(PathBuf::from("/srv/forkd")).unwrap();
    assert_eq!(
        config.metrics_listen,
        Some(SocketAddr::from(([127, 0, 0, 1], 9102)))
    );
    assert_eq!(
        resolve(&ServeFlags::default(), &[], "")
            .unwrap()
            .metrics_listen,
        None
    );
}

#[test]
fn a_typo_in_the_file_is_an_error_naming_the_key() {
    let err = FileConfig::parse("sim_sped = 0").unwrap_err().to_string();
    assert!(err.contains("unknown field `sim_sped`"), "{err}");
    let err = FileConfig::parse("[anthropic]\napi_kye = \"x\"")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `api_kye`"), "{err}");
    let err = FileConfig::parse("provider = \"gpt\"")
        .unwrap_err()
        .to_string();
    assert!(err.contains("provider"), "{err}");
    let err = resolve(&ServeFlags::default(), &[], "grace = \"soon\"")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("config.toml: grace = \"soon\""), "{err}");
}

#[test]
fn bad_environment_values_name_the_variable() {
    for (name, value, expected) in [
        ("FORKD_SIM_SPEED", "fast", "FORKD_SIM_SPEED=\"fast\""),
        ("FORKD_LISTEN", "localhost", "FORKD_LISTEN=\"localhost\""),
        (
            "FORKD_PROVIDER",
            "gpt",
            "expected one of sim, anthropic, openai",
        ),
        ("FORKD_GRACE", "soon", "FORKD_GRACE=\"soon\""),
    ] {
        let err = resolve(&ServeFlags::default(), &[(name, value)], "")
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{name}: {err}");
    }
}

#[test]
fn provider_settings_reach_the_daemon_config_with_env_winning() {
    let file = "provider = \"anthropic\"\n[anthropic]\napi_key = \"file-key\"\nbase_url = \"http://127.0.0.1:8787\"";
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    let config = s.daemon_config(PathBuf::from("/h")).unwrap();
    let anthropic = config.anthropic.unwrap();
    assert_eq!(anthropic.api_key, "file-key");
    assert_eq!(anthropic.base_url, "http://127.0.0.1:8787");
    assert!(!format!("{s:?}").contains("file-key"));

    let s = resolve(
        &ServeFlags::default(),
        &[("ANTHROPIC_API_KEY", "env-key")],
        file,
    )
    .unwrap();
    assert_eq!(
        s.daemon_config(PathBuf::from("/h"))
            .unwrap()
            .anthropic
            .unwrap()
            .api_key,
        "env-key"
    );

    let err = resolve(&ServeFlags::default(), &[], "provider = \"anthropic\"")
        .unwrap()
        .daemon_config(PathBuf::from("/h"))
        .unwrap_err();
    assert!(format!("{err:#}").contains("ANTHROPIC_API_KEY"), "{err:#}");

    let file = "provider = \"openai\"\n[openai]\nmodel = \"qwen\"\nbase_url = \"http://127.0.0.1:8080/v1\"";
    let s = resolve(&ServeFlags::default(), &[("OPENAI_MODEL", "llama")], file).unwrap();
    let openai = s
        .daemon_config(PathBuf::from("/h"))
        .unwrap()
        .openai
        .unwrap();
    assert_eq!(openai.model.as_deref(), Some("llama"));
    assert_eq!(openai.base_url, "http://127.0.0.1:8080/v1");
}

#[test]
fn the_daemon_config_carries_every_setting() {
    let file = "fsync_every_commit = true\nauto_background_secs = 0\nfork_always_async = false\nwarmup_gating = false\nsim_speed = 0";
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    let config = s.daemon_config(PathBuf::from("/h")).unwrap();
    assert_eq!(config.durability, Durability::Full);
    assert_eq!(config.engine.auto_background, None);
    assert!(!config.engine.warmup_gating);
    assert!(!config.engine.fork_always_async);
    assert_eq!(config.sim_speed, 0.0);
}

#[test]
fn resolving_nothing_gives_the_defaults() {
    assert_eq!(
        resolve(&ServeFlags::default(), &[], "").unwrap(),
        Settings::default()
    );
}

#[test]
fn a_value_a_higher_layer_overrides_is_still_checked() {
    let flags = ServeFlags {
        grace: Some(Duration::from_secs(1)),
        provider: Some(ProviderKind::Sim),
        ..ServeFlags::default()
    };
    for (vars, file, expected) in [
        (&[("FORKD_GRACE", "soon")][..], "", "FORKD_GRACE=\"soon\""),
        (
            &[("FORKD_PROVIDER", "gpt")][..],
            "",
            "FORKD_PROVIDER=\"gpt\"",
        ),
        (&[][..], "grace = \"soon\"", "config.toml: grace = \"soon\""),
    ] {
        let err = resolve(&flags, vars, file).unwrap_err().to_string();
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn the_help_shows_the_defaults_resolve_applies() {
    use clap::Args as _;
    let mut command = ServeFlags::augment_args(clap::Command::new("serve"));
    let help = command.render_help().to_string();
    let defaults = Settings::default();
    for expected in [
        "(env FORKD_PROVIDER) [default: sim]".to_owned(),
        format!("(env FORKD_SIM_SPEED) [default: {}]", defaults.sim_speed),
        format!(
            "(env FORKD_AUTO_BACKGROUND_SECS) [default: {}]",
            defaults.auto_background_secs
        ),
        "(env FORKD_GRACE) [default: 10s]".to_owned(),
        format!("(env RUST_LOG) [default: {}]", defaults.log),
    ] {
        assert!(help.contains(&expected), "{expected} in\n{help}");
    }
}

#[test]
fn the_homes_allow_list_and_the_command_limits_come_from_the_file_or_their_defaults() {
    let env = [
        ("HOME", "/home/me"),
        ("PATH", "/usr/bin:/home/me/.volta/bin"),
    ];
    let defaults = resolve(&ServeFlags::default(), &env, "").unwrap();
    let home = defaults.sandbox.home.clone().unwrap();
    assert_eq!(home.dir, PathBuf::from("/home/me"));
    assert!(home.allow.contains(&PathBuf::from("/home/me/.rustup")));
    assert!(home.allow.contains(&PathBuf::from("/home/me/.volta/bin")));
    assert_eq!(
        defaults.sandbox.limits,
        forkd_tools::sandbox::ResourceLimits::default()
    );

    let file = "sandbox_read_allow = [\"~/.tools\", \"/opt/x\"]\n\
                [sandbox_limits]\nprocesses = 64\ncpu_seconds = 0\naddress_space = 1073741824\n\
                session_memory = 2147483648\nsession_processes = 0\n";
    let s = resolve(&ServeFlags::default(), &env, file).unwrap();
    let home = s.sandbox.home.clone().unwrap();
    assert_eq!(
        home.allow,
        [PathBuf::from("/home/me/.tools"), PathBuf::from("/opt/x")]
    );
    let limits = s.sandbox.limits;
    assert_eq!(limits.processes, Some(64));
    assert_eq!(limits.cpu_seconds, None, "0 lifts a limit");
    assert_eq!(limits.address_space, Some(1 << 30));
    assert_eq!(limits.open_files, Some(8192));
    assert_eq!(limits.session_memory, Some(2 << 30));
    assert_eq!(limits.session_processes, None);
    assert_eq!(limits.session_cpu_percent, None);

    let bad = resolve(
        &ServeFlags::default(),
        &env,
        "sandbox_read_allow = [\"rel\"]\n",
    );
    let err = bad.err().unwrap().to_string();
    assert!(err.contains("sandbox_read_allow"), "{err}");
    let unknown = resolve(
        &ServeFlags::default(),
        &env,
        "[sandbox_limits]\nmemory = 1\n",
    );
    assert!(unknown.is_err());
}

#[test]
fn the_sandbox_default_deny_list_and_full_access_tenants_come_from_the_file() {
    let file = "sandbox = \"read-only\"\nsandbox_deny = [\"~/.secrets\", \"/srv/keys\"]\n\
                [tenants.ci]\nallow_full_access = true\n[tenants.web]\nbudget_usd = 1.0\n\
                allow_unix_sockets = true\n";
    let s = resolve(&ServeFlags::default(), &[("HOME", "/home/me")], file).unwrap();
    let engine = s.daemon_config("/srv/forkd".into()).unwrap().engine;
    assert_eq!(
        engine.sandbox.default_mode,
        forkd_core::session::SandboxMode::ReadOnly
    );
    assert_eq!(
        engine.sandbox.hidden,
        vec![
            PathBuf::from("/home/me/.secrets"),
            PathBuf::from("/srv/keys")
        ]
    );
    assert!(engine.sandbox.full_access_tenants.contains("ci"));
    assert!(!engine.sandbox.full_access_tenants.contains("web"));
    assert!(engine.sandbox.unix_socket_tenants.contains("web"));
    assert!(!engine.sandbox.unix_socket_tenants.contains("ci"));
    let env_wins = resolve(
        &ServeFlags::default(),
        &[("FORKD_SANDBOX", "full-access"), ("HOME", "/home/me")],
        file,
    )
    .unwrap();
    assert_eq!(
        env_wins.sandbox.default_mode,
        forkd_core::session::SandboxMode::FullAccess
    );
    let defaults = resolve(&ServeFlags::default(), &[], "").unwrap();
    assert_eq!(
        defaults.sandbox.default_mode,
        forkd_core::session::SandboxMode::WorkspaceWrite
    );
    for (bad, says) in [
        ("sandbox = \"none\"\n", "use workspace-write"),
        ("sandbox_deny = [\"relative\"]\n", "must be absolute"),
    ] {
        let err = resolve(&ServeFlags::default(), &[("HOME", "/home/me")], bad).unwrap_err();
        assert!(format!("{err:#}").contains(says), "{bad}: {err:#}");
    }
}

#[test]
fn the_database_url_comes_from_each_source_and_never_shows_its_password() {
    let url = |s: &Settings| s.database_url.as_ref().map(|u| u.as_str().to_owned());
    let file = "database_url = \"postgres://forkd:file-pw-x9@db.example:5432/forkd\"\n";
    assert_eq!(
        resolve(&ServeFlags::default(), &[], "")
            .unwrap()
            .database_url,
        None
    );
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    assert_eq!(
        url(&s).as_deref(),
        Some("postgres://forkd:file-pw-x9@db.example:5432/forkd")
    );
    let env = [(
        "FORKD_DATABASE_URL",
        "postgresql://forkd:env-pw-x9@127.0.0.1/forkd",
    )];
    let s = resolve(&ServeFlags::default(), &env, file).unwrap();
    assert_eq!(
        url(&s).as_deref(),
        Some("postgresql://forkd:env-pw-x9@127.0.0.1/forkd")
    );
    let flags = ServeFlags {
        database_url: Some("postgres://flag@db.example/forkd".parse().unwrap()),
        ..ServeFlags::default()
    };
    let s = resolve(&flags, &env, file).unwrap();
    assert_eq!(url(&s).as_deref(), Some("postgres://flag@db.example/forkd"));
    let config = s.daemon_config("/srv/forkd".into()).unwrap();
    assert_eq!(config.database_url, s.database_url);

    // What the settings and the daemon's configuration show (debug output, logs) hides it.
    let s = resolve(&ServeFlags::default(), &env, file).unwrap();
    let shown = format!("{s:?} {:?}", s.daemon_config("/srv/forkd".into()).unwrap());
    assert!(!shown.contains("pw-x9"), "{shown}");
    assert!(
        shown.contains("postgresql://forkd:***@127.0.0.1/forkd"),
        "{shown}"
    );
    let file_config = format!("{:?}", FileConfig::parse(file).unwrap());
    assert!(!file_config.contains("pw-x9"), "{file_config}");

    // Only PostgreSQL URLs, from any source, even one a higher layer overrides; the error names
    // the source and shows no password.
    let bad_flag = ServeFlags {
        database_url: Some("mysql://root:flag-pw-x9@h/d".parse().unwrap()),
        ..ServeFlags::default()
    };
    for (flags, vars, file, source) in [
        (
            &ServeFlags::default(),
            &[("FORKD_DATABASE_URL", "mysql://root:env-pw-x9@h/d")][..],
            "",
            "FORKD_DATABASE_URL: \"mysql://root:***@h/d\"",
        ),
        (
            &ServeFlags::default(),
            &env[..],
            "database_url = \"sqlite:///srv/forkd.db\"",
            "config.toml: database_url: \"sqlite:///srv/forkd.db\"",
        ),
        (
            &bad_flag,
            &[][..],
            "",
            "--database-url: \"mysql://root:***@h/d\"",
        ),
    ] {
        let err = format!("{:#}", resolve(flags, vars, file).unwrap_err());
        assert!(err.contains(source), "{err}");
        assert!(err.contains("is not a PostgreSQL URL"), "{err}");
        assert!(!err.contains("pw-x9"), "{err}");
    }
}

#[test]
fn the_lease_comes_from_its_layers_and_must_last() {
    let s = resolve(&ServeFlags::default(), &[], "").unwrap();
    assert_eq!(s.lease, Duration::from_secs(5));
    let s = resolve(&ServeFlags::default(), &[], "lease = \"2s\"").unwrap();
    assert_eq!(s.lease, Duration::from_secs(2));
    let s = resolve(
        &ServeFlags::default(),
        &[("FORKD_LEASE", "750ms")],
        "lease = \"2s\"",
    )
    .unwrap();
    assert_eq!(s.lease, Duration::from_millis(750));
    assert_eq!(
        s.daemon_config(PathBuf::from("/h")).unwrap().lease,
        Duration::from_millis(750)
    );
    let err = resolve(&ServeFlags::default(), &[], "lease = \"0s\"")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("lease") && err.contains("at least 100ms"),
        "{err}"
    );
    let err = resolve(&ServeFlags::default(), &[("FORKD_LEASE", "10ms")], "")
        .unwrap_err()
        .to_string();
    assert!(err.contains("FORKD_LEASE"), "{err}");
}

#[test]
fn isolated_copies_take_their_disk_cap_and_retention_from_the_file() {
    let defaults = resolve(&ServeFlags::default(), &[], "").unwrap();
    assert_eq!(defaults.isolation.disk_cap, Some(4 << 30));
    assert_eq!(
        defaults.isolation.retention,
        Duration::from_secs(7 * 24 * 3600)
    );
    let file = "[isolation]\ndisk_cap_mib = 512\nretention = \"2h\"\n";
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    let engine = s.daemon_config("/srv/forkd".into()).unwrap().engine;
    assert_eq!(engine.isolation.disk_cap, Some(512 << 20));
    assert_eq!(engine.isolation.retention, Duration::from_secs(7200));
    let off = resolve(
        &ServeFlags::default(),
        &[],
        "[isolation]\ndisk_cap_mib = 0\n",
    )
    .unwrap();
    assert_eq!(off.isolation.disk_cap, None, "0 lifts the cap");
    let bad = resolve(
        &ServeFlags::default(),
        &[],
        "[isolation]\nretention = \"soon\"\n",
    );
    let err = bad.err().unwrap().to_string();
    assert!(err.contains("[isolation] retention"), "{err}");
}

#[test]
fn traces_come_from_the_flag_the_otel_variables_or_the_file_and_are_off_without_an_endpoint() {
    use crate::telemetry::OtlpProtocol;
    let none = ServeFlags::default();
    assert_eq!(resolve(&none, &[], "").unwrap().tracing, None);
    let file = "[tracing]\nendpoint = \"http://collector:4318\"\nprotocol = \"http/protobuf\"\n\
                headers = { api-key = \"k\" }\nservice_name = \"forkd-ci\"\ncapture_content = true";
    let t = resolve(&none, &[], file).unwrap().tracing.unwrap();
    assert_eq!(t.endpoint, "http://collector:4318/v1/traces");
    assert_eq!(t.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(t.headers, [("api-key".to_owned(), "k".to_owned())]);
    assert_eq!(
        (t.service_name.as_str(), t.capture_content),
        ("forkd-ci", true)
    );

    // The standard variables win over the file; the traces-specific endpoint is taken whole.
    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4317"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-team=forkd"),
        ("OTEL_SERVICE_NAME", "forkd-env"),
    ];
    let t = resolve(&none, &vars, file).unwrap().tracing.unwrap();
    assert_eq!(t.endpoint, "http://otel:4317");
    assert_eq!(t.protocol, OtlpProtocol::Grpc);
    assert_eq!(t.headers, [("x-team".to_owned(), "forkd".to_owned())]);
    assert_eq!(t.service_name, "forkd-env");
    let whole = [
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://otel:4318/custom/traces",
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    ];
    let t = resolve(&none, &whole, "").unwrap().tracing.unwrap();
    assert_eq!(t.endpoint, "http://otel:4318/custom/traces");
    assert_eq!(t.service_name, "forkd");

    // The flag wins; OTEL_SDK_DISABLED turns it all off; a bad protocol names itself.
    let flags = ServeFlags {
        otlp_endpoint: Some("http://flag:4317".into()),
        ..ServeFlags::default()
    };
    let t = resolve(&flags, &vars, file).unwrap().tracing.unwrap();
    assert_eq!(t.endpoint, "http://flag:4317");
    let off = [
        ("OTEL_SDK_DISABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4317"),
    ];
    assert_eq!(resolve(&none, &off, "").unwrap().tracing, None);
    let linked = "[tracing]\ntrace_url_template = \"http://jaeger:16686/trace/{trace_id}\"";
    let s = resolve(&none, &[], linked).unwrap();
    assert_eq!(
        s.daemon_config(PathBuf::from("/srv/forkd"))
            .unwrap()
            .trace_url_template
            .as_deref(),
        Some("http://jaeger:16686/trace/{trace_id}")
    );
    let bad = [("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")];
    let err = resolve(&flags, &bad, "").unwrap_err().to_string();
    assert!(err.contains("http/json"), "{err}");
}

#[test]
fn min_free_disk_comes_from_the_flag_the_environment_or_the_file() {
    use forkd_engine::MinFreeDisk;
    let defaults = resolve(&ServeFlags::default(), &[], "").unwrap();
    assert_eq!(defaults.min_free_disk, MinFreeDisk::Default);
    let file = "min_free_disk = \"2%\"\n";
    let s = resolve(&ServeFlags::default(), &[], file).unwrap();
    assert_eq!(s.min_free_disk, MinFreeDisk::Percent(2.0));
    let s = resolve(
        &ServeFlags::default(),
        &[("FORKD_MIN_FREE_DISK", "1GiB")],
        file,
    )
    .unwrap();
    assert_eq!(s.min_free_disk, MinFreeDisk::Bytes(1 << 30));
    let flags = ServeFlags {
        min_free_disk: Some(MinFreeDisk::Bytes(0)),
        ..ServeFlags::default()
    };
    let s = resolve(&flags, &[("FORKD_MIN_FREE_DISK", "1GiB")], file).unwrap();
    assert_eq!(s.min_free_disk, MinFreeDisk::Bytes(0), "the flag wins");
    let engine = s.daemon_config("/srv/forkd".into()).unwrap().engine;
    assert_eq!(engine.min_free_disk, MinFreeDisk::Bytes(0));
    for bad in ["min_free_disk = \"lots\"\n", "min_free_disk = \"200%\"\n"] {
        let err = resolve(&ServeFlags::default(), &[], bad).unwrap_err();
        assert!(
            format!("{err:#}").contains("min_free_disk"),
            "{bad}: {err:#}"
        );
    }
    let err = resolve(&ServeFlags::default(), &[("FORKD_MIN_FREE_DISK", "x")], "").unwrap_err();
    assert!(
        format!("{err:#}").contains("FORKD_MIN_FREE_DISK"),
        "{err:#}"
    );
}
