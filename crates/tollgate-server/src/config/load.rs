//! Reading configuration files and directories into a [`Config`].

use std::path::{Path, PathBuf};

use super::{Config, ConfigError, Domain};

impl Domain {
    /// Adds `other`'s top-level descriptors to this domain's
    /// (`MERGE_DOMAIN_CONFIG`).
    ///
    /// # Errors
    ///
    /// When both hold a descriptor with the same `key_value`.
    pub fn merge(&mut self, other: Domain) -> Result<(), ConfigError> {
        for node in other.descriptors.nodes {
            if self.descriptors.contains(&node.composite) {
                return Err(ConfigError {
                    file: other.file.clone(),
                    line: None,
                    message: format!(
                        "duplicate descriptor composite key \"{}.{}\"",
                        self.domain, node.composite
                    ),
                });
            }
            self.descriptors.push(node);
        }
        self.value_to_metric |= other.value_to_metric;
        Ok(())
    }
}

/// How a configuration directory is laid out and read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// envoyproxy/ratelimit's runtime layout: every file under the directory,
    /// at any depth and of any name, is a configuration file. Otherwise only
    /// the directory's own `*.yaml` / `*.yml` files are.
    pub runtime_layout: bool,
    /// With `runtime_layout`, skip files and directories whose name starts
    /// with a dot (`RUNTIME_IGNOREDOTFILES`).
    pub ignore_dot_files: bool,
    /// Files of one domain are merged instead of refused (`MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
}

impl Config {
    /// Loads a file, or every `*.yaml` / `*.yml` file of a directory (one
    /// domain per file).
    ///
    /// # Errors
    ///
    /// The first file that cannot be read or used, or a domain defined twice
    /// (naming both files).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with(path, LoadOptions::default())
    }

    /// Loads a file or a directory laid out as `options` say.
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    pub fn load_with(path: &Path, options: LoadOptions) -> Result<Self, ConfigError> {
        let unreadable = |file: &Path, error: std::io::Error| ConfigError {
            file: file.to_owned(),
            line: None,
            message: format!("cannot read: {error}"),
        };
        let mut files = Vec::new();
        if path.is_dir() {
            collect_files(path, options, &mut files).map_err(|error| unreadable(path, error))?;
            files.sort();
        } else {
            files.push(path.to_owned());
        }
        let mut config = Self::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|error| unreadable(&file, error))?;
            config.insert(Domain::parse(&text, &file)?, options.merge_domains)?;
        }
        Ok(config)
    }

    /// Adds a domain, or with `merge` merges it into the one of its name.
    ///
    /// # Errors
    ///
    /// As [`Config::add`] and [`Domain::merge`].
    pub(super) fn insert(&mut self, domain: Domain, merge: bool) -> Result<(), ConfigError> {
        match self.domains.get_mut(&domain.domain) {
            Some(existing) if merge => existing.merge(domain),
            _ => self.add(domain),
        }
    }

    /// Adds a domain.
    ///
    /// # Errors
    ///
    /// When the domain is already defined.
    pub fn add(&mut self, domain: Domain) -> Result<(), ConfigError> {
        if let Some(existing) = self.domains.get(&domain.domain) {
            return Err(ConfigError {
                file: domain.file.clone(),
                line: Some(1),
                message: format!(
                    "duplicate domain \"{}\" in config file (already in {})",
                    domain.domain,
                    existing.file.display()
                ),
            });
        }
        self.domains.insert(domain.domain.clone(), domain);
        Ok(())
    }
}

/// The configuration files under `directory`.
fn collect_files(directory: &Path, options: LoadOptions, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(directory)? {
        let path = entry?.path();
        let dotted = path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with('.'));
        if options.runtime_layout {
            if dotted && options.ignore_dot_files {
                continue;
            }
            if path.is_dir() {
                collect_files(&path, options, files)?;
            } else if path.is_file() {
                files.push(path);
            }
        } else if path.is_file()
            && path
                .extension()
                .is_some_and(|extension| extension == "yaml" || extension == "yml")
        {
            files.push(path);
        }
    }
    Ok(())
}
