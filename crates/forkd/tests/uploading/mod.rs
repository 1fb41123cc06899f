//! Helpers of the uploaded-workspace tests (`uploads.rs`, `upload_layers.rs`): a daemon with two
//! token tenants, trees as manifest entries and contents, uploads and sessions from them.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;

use forkd_core::upload::blob_hash;
use forkd_proto::v1 as pb;
use forkd_server::TokenStore;
use forkd_test_support::{Caller, TestDaemon, spawn_daemon_with, trusted_session_request};
use pb::upload_entry::Kind;
use pb::upload_workspace_request::Part;

pub const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

pub struct Two {
    pub daemon: TestDaemon,
    pub alice: Caller,
    pub mallory: Caller,
}

/// A daemon on TCP with tokens for alice and mallory; an upload holds at most 64 KiB and 8
/// files, and mallory's blobs at most 5,000 bytes.
pub async fn two_tenants() -> Two {
    two_tenants_with(true).await
}

/// [`two_tenants`]; `layered`: sessions made from uploads work in layers over kept trees (where
/// `/forkd/workspaces` is here), else each gets a copy.
pub async fn two_tenants_with(layered: bool) -> Two {
    let mut secrets = Vec::new();
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some(LOOPBACK);
        c.layered_uploads = layered;
        let tokens = TokenStore::in_home(&c.home);
        secrets.push(tokens.create("alice").unwrap());
        secrets.push(tokens.create("mallory").unwrap());
        c.engine.uploads = forkd_core::upload::UploadLimits {
            max_bytes: 64 << 10,
            max_files: 8,
            quotas: [("mallory".to_owned(), 5_000)].into(),
            ..Default::default()
        };
    })
    .await
    .unwrap();
    let alice = Caller::new(&daemon, secrets[0].expose()).await.unwrap();
    let mallory = Caller::new(&daemon, secrets[1].expose()).await.unwrap();
    Two {
        daemon,
        alice,
        mallory,
    }
}

pub fn file(path: &str, content: &[u8], executable: bool) -> (pb::UploadEntry, Vec<u8>) {
    let entry = pb::UploadEntry {
        path: path.into(),
        kind: Some(Kind::File(pb::UploadFile {
            sha256: blob_hash(content),
            size: content.len() as u64,
            executable,
        })),
    };
    (entry, content.to_vec())
}

pub fn link(path: &str, target: &str) -> (pb::UploadEntry, Vec<u8>) {
    let entry = pb::UploadEntry {
        path: path.into(),
        kind: Some(Kind::Symlink(target.into())),
    };
    (entry, Vec::new())
}

pub async fn missing(caller: &mut Caller, tree: &[(pb::UploadEntry, Vec<u8>)]) -> Vec<String> {
    let hashes = tree
        .iter()
        .filter_map(|(e, _)| match &e.kind {
            Some(Kind::File(f)) => Some(f.sha256.clone()),
            _ => None,
        })
        .collect();
    let request = caller.req(pb::FindMissingBlobsRequest { hashes });
    caller
        .client
        .find_missing_blobs(request)
        .await
        .unwrap()
        .into_inner()
        .missing
}

/// Uploads `tree`'s manifest and the blobs named in `send` (in pieces of 1000 bytes).
pub async fn upload(
    caller: &mut Caller,
    tree: &[(pb::UploadEntry, Vec<u8>)],
    send: &[String],
) -> Result<pb::UploadWorkspaceResponse, tonic::Status> {
    let mut messages = vec![pb::UploadWorkspaceRequest {
        part: Some(Part::Manifest(pb::UploadManifest {
            entries: tree.iter().map(|(e, _)| e.clone()).collect(),
            git_commit: String::new(),
        })),
    }];
    let mut sent = std::collections::HashSet::new();
    for (entry, content) in tree {
        let Some(Kind::File(f)) = &entry.kind else {
            continue;
        };
        if !send.contains(&f.sha256) || !sent.insert(f.sha256.clone()) {
            continue;
        }
        let pieces: Vec<&[u8]> = if content.is_empty() {
            vec![&[]]
        } else {
            content.chunks(1000).collect()
        };
        for (i, piece) in pieces.iter().enumerate() {
            messages.push(pb::UploadWorkspaceRequest {
                part: Some(Part::Blob(pb::BlobChunk {
                    sha256: f.sha256.clone(),
                    data: piece.to_vec(),
                    last: i + 1 == pieces.len(),
                })),
            });
        }
    }
    let request = caller.req(tokio_stream::iter(messages));
    caller
        .client
        .upload_workspace(request)
        .await
        .map(tonic::Response::into_inner)
}

pub fn tree() -> Vec<(pb::UploadEntry, Vec<u8>)> {
    vec![
        file("README.md", b"# the project\n", false),
        file("bin/run.sh", b"#!/bin/sh\necho run\n", true),
        file("src/lib.rs", &b"fn x() {}\n".repeat(300), false),
        file("empty", b"", false),
        link("src/readme", "../README.md"),
    ]
}

pub async fn session_from(
    caller: &mut Caller,
    upload_id: &str,
) -> Result<pb::Session, tonic::Status> {
    let request = pb::CreateSessionRequest {
        workspace: String::new(),
        upload_id: upload_id.into(),
        ..trusted_session_request(Path::new(""))
    };
    caller
        .create_session(request)
        .await
        .map_err(|e| e.downcast::<tonic::Status>().expect("a gRPC status"))
}
