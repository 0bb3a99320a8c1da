//! Certificates made for a test: one CA, and leaves it signs for
//! `localhost` / 127.0.0.1, written as PEM files in a temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// A CA and the files of the leaves it signed.
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub dir: tempfile::TempDir,
}

/// A leaf's files.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Default for Authority {
    fn default() -> Self {
        Self::new()
    }
}

impl Authority {
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tollgate test CA");
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), issuer.pem()).unwrap();
        Self { issuer, dir }
    }

    /// The CA certificate's file.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A leaf for `localhost`, 127.0.0.1 and `names`, usable by servers and
    /// clients, written as `<file>.pem` and `<file>.key`.
    pub fn leaf(&self, file: &str, names: &[&str]) -> Leaf {
        let mut all = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        all.extend(names.iter().map(|name| (*name).to_owned()));
        let mut params = CertificateParams::new(all).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let leaf = Leaf {
            cert: self.dir.path().join(format!("{file}.pem")),
            key: self.dir.path().join(format!("{file}.key")),
        };
        write(&leaf.cert, &cert.pem());
        write(&leaf.key, &key.serialize_pem());
        leaf
    }
}

/// Replaces a file as a secret rotation does: written aside, then renamed.
pub fn write(path: &Path, text: &str) {
    let aside = path.with_extension("new");
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, path).unwrap();
}
